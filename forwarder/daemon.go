package main

// The daemon path, as shim.call_daemon: the request built before connecting, SO_PEERCRED read
// before a byte is sent (a listener of another uid gets nothing), the ACK awaited up to
// acceptTimeout, and after it the reply relayed as is. A request the daemon never accepted comes
// back as notRun (nothing ran: the caller may run it elsewhere); one accepted whose reply was
// lost is an error 11, never a second run.

import (
	"bytes"
	"errors"
	"io"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// acceptTimeout is shim.ACCEPT_TIMEOUT (a systemd restart's stop and start, and a margin).
const acceptTimeout = 300 * time.Second

type reply struct {
	stdout, stderr []byte
	code           int
}

// notRun says why the daemon did not take a request (nothing ran), as the shim words it.
type notRun string

const oPath = 0x200000 // O_PATH (not in package syscall)

// openFds is shim.open_fds: the fds a request carries, and their roles.
func openFds(netns string) (uint8, []int) {
	var roles uint8
	var fds []int
	if netns != "" {
		fd, err := syscall.Open(netns, syscall.O_RDONLY|syscall.O_CLOEXEC|syscall.O_NONBLOCK, 0)
		if err == nil {
			roles, fds = roleNetns, []int{fd}
		}
	}
	for _, o := range []struct {
		role  uint8
		path  string
		extra int
	}{{roleCallNet, "/proc/thread-self/ns/net", 0}, {roleCallMnt, "/proc/thread-self/ns/mnt", 0},
		{roleCwd, ".", oPath | syscall.O_DIRECTORY}} {
		fd, err := syscall.Open(o.path, syscall.O_RDONLY|syscall.O_CLOEXEC|o.extra, 0)
		if err != nil {
			continue
		}
		fds = append(fds, fd)
		roles |= o.role
	}
	return roles, fds
}

// strerror is the C library's text for an errno (Python's OSError.strerror): Go's table is
// glibc's with the first letter lowered.
func strerror(err error) string {
	var errno syscall.Errno
	if errors.As(err, &errno) {
		s := errno.Error()
		if s != "" && s[0] >= 'a' && s[0] <= 'z' {
			s = string(s[0]-'a'+'A') + s[1:]
		}
		return s
	}
	return err.Error()
}

func umask() uint32 {
	old := syscall.Umask(0o022)
	syscall.Umask(old)
	return uint32(old)
}

// callDaemon is shim.call_daemon. The socket is a plain blocking fd with SO_SNDTIMEO and
// SO_RCVTIMEO for the deadlines, as Python's settimeout gives the shim: package net's poller
// (an epoll instance, its eventfd, deadline timers) cost each exec 0.05-0.13 ms of CPU here,
// of ~1.1 (bench/forwarder_cpu.py; a bare Go program's exec is ~1.0).
func callDaemon(plugin string, env [][2]string, stdin []byte, path string) (*reply, notRun) {
	roles, fds := openFds(getenv(env, "CNI_NETNS"))
	defer func() {
		for _, fd := range fds {
			syscall.Close(fd)
		}
	}()
	data := encodeRequest(plugin, encodeEnv(env), stdin, roles, umask())
	if len(path) > 108 { // sizeof sun_path: Python's own check and words
		return nil, "connect: AF_UNIX path too long"
	}
	if strings.HasPrefix(path, "@") {
		path = "./" + path // a file named @..., as Python connects: Go would go abstract
	}
	conn, err := dial(path)
	if err != nil { // missing, refused, not allowed, backlog full: no daemon for us
		return nil, notRun("connect: " + strerror(err))
	}
	defer conn.Close()
	cred, err := syscall.GetsockoptUcred(conn.fd, syscall.SOL_SOCKET, syscall.SO_PEERCRED)
	if err != nil {
		return nil, notRun("cannot tell who listens: " + strerror(err))
	}
	if cred.Uid != 0 {
		return nil, notRun("the socket's listener runs as uid " + strconv.FormatUint(uint64(cred.Uid), 10) + ", not root")
	}
	if !send(conn, data, fds) {
		return nil, "the daemon hung up before it took the request"
	}
	return receive(conn, stdin)
}

// unixConn is the connection to the daemon: a blocking stream socket whose reads and writes
// end after its timeouts (errTimeout).
type unixConn struct{ fd int }

var errTimeout = errors.New("timed out")

// dial connects without blocking (a full backlog is EAGAIN at once, as for the shim and
// package net), then makes the socket blocking with acceptTimeout both ways.
func dial(path string) (*unixConn, error) {
	fd, err := syscall.Socket(syscall.AF_UNIX, syscall.SOCK_STREAM|syscall.SOCK_CLOEXEC|
		syscall.SOCK_NONBLOCK, 0)
	if err != nil {
		return nil, err
	}
	if err := syscall.Connect(fd, &syscall.SockaddrUnix{Name: path}); err != nil {
		syscall.Close(fd)
		return nil, err
	}
	c := &unixConn{fd}
	if err := syscall.SetNonblock(fd, false); err != nil {
		c.Close()
		return nil, err
	}
	c.setTimeout(syscall.SO_SNDTIMEO, acceptTimeout)
	c.setTimeout(syscall.SO_RCVTIMEO, acceptTimeout)
	return c, nil
}

func (c *unixConn) Close() { syscall.Close(c.fd) }

// setTimeout sets SO_SNDTIMEO or SO_RCVTIMEO; 0: none.
func (c *unixConn) setTimeout(opt int, d time.Duration) {
	tv := syscall.NsecToTimeval(d.Nanoseconds())
	_ = syscall.SetsockoptTimeval(c.fd, syscall.SOL_SOCKET, opt, &tv)
}

func (c *unixConn) Read(b []byte) (int, error) {
	for {
		n, err := syscall.Read(c.fd, b)
		switch {
		case err == syscall.EINTR:
			continue
		case err == syscall.EAGAIN:
			return 0, errTimeout
		case err != nil:
			return 0, err
		case n == 0 && len(b) > 0:
			return 0, io.EOF
		}
		return n, nil
	}
}

func (c *unixConn) write(b []byte, oob []byte) (int, error) {
	for {
		n, err := syscall.SendmsgN(c.fd, b, oob, nil, syscall.MSG_NOSIGNAL)
		if err == syscall.EINTR {
			continue
		}
		return n, err
	}
}

// send writes the request, its fds on the first bytes; false if the daemon hung up first.
func send(conn *unixConn, data []byte, fds []int) bool {
	var rights []byte
	if len(fds) > 0 {
		rights = syscall.UnixRights(fds...)
	}
	n, err := conn.write(data, rights)
	for err == nil && n < len(data) {
		var more int
		more, err = conn.write(data[n:], nil)
		n += more
	}
	return err == nil
}

// receive is shim._receive.
func receive(conn *unixConn, stdin []byte) (*reply, notRun) {
	first := make([]byte, 1)
	n, err := conn.Read(first)
	switch {
	case n == 0 && err == errTimeout:
		// It has the whole request and may still start it: never run it a second time.
		return lost(stdin, "the pycni daemon did not accept the request in time"), ""
	case n == 0 && (err == nil || errors.Is(err, io.EOF)):
		return nil, "it closed the connection before it took the request"
	case n == 0:
		return nil, notRun("it reset the connection before it took the request: " +
			strerror(err))
	case first[0] == replyByte:
		return nil, refusal(conn)
	}
	if first[0] != deniedByte { // accepted: the daemon's timeout bounds the run
		conn.setTimeout(syscall.SO_RCVTIMEO, 0)
	} // (denied: nothing ran, and the REPLY that follows is the answer, within acceptTimeout)
	head, err := readExact(conn, replyPrefix)
	if err != nil {
		return lost(stdin, "the pycni daemon stopped while running the request"), ""
	}
	code, outLen, errLen, err := replySizes(head)
	if err != nil {
		return lost(stdin, "the pycni daemon stopped while running the request"), ""
	}
	body, err := readExact(conn, int64(outLen)+int64(errLen))
	if err != nil {
		return lost(stdin, "the pycni daemon stopped while running the request"), ""
	}
	return &reply{body[:outLen], body[outLen:], int(code)}, ""
}

// refusal is shim._refusal: why the daemon refused (its CNI error's msg).
func refusal(conn *unixConn) notRun {
	why := "(unreadable)"
	head, err := readExact(conn, replyPrefix-1)
	if err == nil {
		_, outLen, _, err := replySizes(append([]byte{replyByte}, head...))
		if err == nil {
			size := int64(outLen)
			if size > 1<<16 {
				size = 1 << 16
			}
			if out, err := readExact(conn, size); err == nil {
				if v, ok := decodeJSON(out); ok {
					if m, isMap := v.(map[string]interface{}); isMap {
						if msg, isStr := m["msg"].(string); isStr {
							why = msg
						}
					}
				}
			}
		}
	}
	return notRun("it refused the request: " + why)
}

// readExact reads size bytes, growing its buffer as they come (a size the peer made up costs
// only what it sends); an error if the connection ends first.
func readExact(conn io.Reader, size int64) ([]byte, error) {
	var buf bytes.Buffer
	if size < 1<<20 {
		buf.Grow(int(size))
	}
	n, err := io.CopyN(&buf, conn, size)
	if n < size {
		if err == nil {
			err = io.ErrUnexpectedEOF
		}
		return nil, err
	}
	return buf.Bytes(), nil
}

// lost is shim.lost: the request may have run but its answer was lost: 11, the runtime retries.
func lost(stdin []byte, why string) *reply {
	return &reply{errorReply(tryAgainCode, why, stdin), nil, 1}
}
