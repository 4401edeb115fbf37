package main

// The wire format of cni/fast/protocol.py (its docstring is the specification): one request per
// connection, MAGIC, a big-endian header (!IIIBI: plugin, env, stdin lengths, fd roles, umask),
// then the plugin name, the env block ("K=V\0"...) and stdin; the daemon answers an ACK byte
// once a child committed to running it, then a REPLY: "R", !iII (exit code, stdout and stderr
// lengths) and the bytes. A REPLY without an ACK is a refusal: nothing ran.

import (
	"encoding/binary"
	"errors"
	"strings"
)

const (
	magic        = "PYCNI\x01"
	ackByte      = 'A'
	replyByte    = 'R'
	replyPrefix  = 1 + 12 // "R" + !iII
	roleNetns    = 1      // the container's namespace (CNI_NETNS opened here)
	roleCallNet  = 2      // the network namespace the forwarder runs in
	roleCallMnt  = 4      // its mount namespace
	roleCwd      = 8      // its working directory
	maxStdin     = 16 * 1024 * 1024
	socketEnv    = "PYCNI_SOCKET"
	fallbackEnv  = "PYCNI_SHIM_FALLBACK"
	defaultSock  = "/run/pycni/pycni.sock"
	tryAgainCode = 11
)

// daemonCommands are the verbs the shim sends to the daemon (shim.DAEMON_COMMANDS).
var daemonCommands = map[string]bool{"ADD": true, "CHECK": true, "DEL": true, "GC": true,
	"STATUS": true}

// environ is the process environment as Python's posix.environ holds it: entries without "="
// dropped, the first of a repeated name kept, in first-seen order.
func environ(raw []string) [][2]string {
	seen := make(map[string]bool, len(raw))
	out := make([][2]string, 0, len(raw))
	for _, kv := range raw {
		eq := strings.IndexByte(kv, '=')
		if eq < 0 || seen[kv[:eq]] {
			continue
		}
		seen[kv[:eq]] = true
		out = append(out, [2]string{kv[:eq], kv[eq+1:]})
	}
	return out
}

// getenv is posix.environ.get(name, b""): the first entry of that name.
func getenv(env [][2]string, name string) string {
	for _, kv := range env {
		if kv[0] == name {
			return kv[1]
		}
	}
	return ""
}

// encodeEnv is protocol.encode_env: "K=V\0" for each entry.
func encodeEnv(env [][2]string) []byte {
	var b []byte
	for _, kv := range env {
		b = append(append(append(append(b, kv[0]...), '='), kv[1]...), 0)
	}
	return b
}

// encodeRequest is protocol.encode_request.
func encodeRequest(plugin string, env, stdin []byte, roles uint8, umask uint32) []byte {
	out := make([]byte, 0, len(magic)+13+len(plugin)+len(env)+len(stdin))
	out = append(out, magic...)
	out = binary.BigEndian.AppendUint32(out, uint32(len(plugin)))
	out = binary.BigEndian.AppendUint32(out, uint32(len(env)))
	out = binary.BigEndian.AppendUint32(out, uint32(len(stdin)))
	out = append(out, roles)
	out = binary.BigEndian.AppendUint32(out, umask)
	out = append(out, plugin...)
	out = append(out, env...)
	return append(out, stdin...)
}

var errNotReply = errors.New("not a pycni reply")

// replySizes is protocol.reply_sizes: (code, stdout length, stderr length).
func replySizes(head []byte) (int32, uint32, uint32, error) {
	if len(head) < replyPrefix || head[0] != replyByte {
		return 0, 0, 0, errNotReply
	}
	return int32(binary.BigEndian.Uint32(head[1:5])), binary.BigEndian.Uint32(head[5:9]),
		binary.BigEndian.Uint32(head[9:13]), nil
}
