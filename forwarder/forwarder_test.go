package main

// Units of the forwarder against the shim's bytes (the expected strings are what the Python
// functions named print; tests/test_forwarder.py compares whole runs of both executables).

import (
	"bytes"
	"encoding/binary"
	"net"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

var all = []string{"0.1.0", "0.2.0", "0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0"}

func TestAskedVersionIsShimsAskedVersion(t *testing.T) {
	cases := []struct {
		stdin, want string
		ok          bool
	}{
		{"", current, true}, {" \n", current, true}, {"{}", current, true},
		{" { \t} ", current, true}, {`{"cniVersion": "0.4.0"}`, "0.4.0", true},
		{`{"cniVersion":"9.9.9"}`, current, true}, {`{"cniVersion": "0.4.0", "x": 1}`, "", false},
		{`{"cniVersion": "a\"b"}`, "", false}, {`{"cniVersion": 1}`, "", false},
		{`{"name": "x"}`, "", false}, {`[]`, "", false}, {"{\"cniVersion\": \"\xc3\xa9\"}", "", false},
	}
	for _, c := range cases {
		got, ok := askedVersion([]byte(c.stdin), all)
		if got != c.want || ok != c.ok {
			t.Errorf("askedVersion(%q) = %q, %v; want %q, %v", c.stdin, got, ok, c.want, c.ok)
		}
	}
	if got, _ := askedVersion([]byte(`{"cniVersion":"0.2.0"}`), all[2:]); got != current {
		t.Errorf("a version the plugin does not speak echoed: %q", got)
	}
}

func TestVersionReplyIsSkelsBytes(t *testing.T) {
	want := `{"cniVersion": "0.4.0", "supportedVersions": ["0.4.0", "1.0.0", "1.1.0"]}`
	if got := string(versionReply("0.4.0", all[4:])); got != want {
		t.Errorf("got %s", got)
	}
	if got := string(versionInfo([]byte(`{"x": [1, 2], "cniVersion": "1.0.0"}`), all)); !strings.HasPrefix(
		got, `{"cniVersion": "1.0.0", `) {
		t.Errorf("versionInfo did not read the version: %s", got)
	}
	if got := string(versionInfo([]byte(`[1]`), all)); !strings.HasPrefix(got, `{"cniVersion": "1.1.0"`) {
		t.Errorf("a list is no config: %s", got)
	}
}

func TestPyStringIsJSONDumps(t *testing.T) {
	// json.dumps('a"b\\c\n\t\x01\x7f é 😀') and json.dumps('x\udcff') (a byte surrogateescape made)
	for in, want := range map[string]string{
		"a\"b\\c\n\t\x01\x7f é 😀": `"a\"b\\c\n\t\u0001\u007f \u00e9 \ud83d\ude00"`,
		"x\xff":                   `"x\udcff"`,
	} {
		if got := pyString(in); got != want {
			t.Errorf("pyString(%q) = %s, want %s", in, got, want)
		}
	}
}

func TestErrorReplyIsCNIErrorToJSON(t *testing.T) {
	want := "{\n    \"cniVersion\": \"0.4.0\",\n    \"code\": 11,\n    \"msg\": \"why \\u00e9\",\n" +
		"    \"details\": \"\"\n}"
	if got := string(errorReply(11, "why é", []byte(`{"cniVersion":"0.4.0"}`))); got != want {
		t.Errorf("got %q", got)
	}
}

func TestConfigVersionIsProtocolsConfigVersion(t *testing.T) {
	for stdin, want := range map[string]string{
		"": "1.1.0", "[]": "1.1.0", "{}": "0.1.0", `{"cniVersion":""}`: "0.1.0",
		`{"cniVersion":0}`: "0.1.0", `{"cniVersion":0.0}`: "0.1.0", `{"cniVersion":1}`: "1.1.0",
		`{"cniVersion":"9.9"}`: "9.9", "\xef\xbb\xbf{\"cniVersion\":\"0.3.1\"}": "0.3.1",
		`{"cniVersion":"0.3.1"} x`: "1.1.0", `{"cniVersion":"0.3.1","cniVersion":"1.0.0"}`: "1.0.0",
		`{"cniVersion":null}`: "0.1.0", `{"a":1e999,"cniVersion":"0.2.0"}`: "0.2.0",
		"{\"cniVersion\":\"0.3.1\",\"x\":\"\xff\"}":      "1.1.0",
		`{"cniVersion":"a\ud83d\ude00\ud83d\n\u00e9\/"}`: "a\U0001F600\xed\xa0\xbd\n\u00e9/",
		"{\"cniVersion\":\"\xed\xa0\xbd\"}":              "\xed\xa0\xbd",
	} {
		if got := configVersion([]byte(stdin)); got != want {
			t.Errorf("configVersion(%q) = %q, want %q", stdin, got, want)
		}
	}
}

func TestLoneSurrogatesAreWrittenBackAsPythonDoes(t *testing.T) {
	// json.dumps(json.loads('"\\ud83d\\ude00\\udc00x"'))
	got := pyQuote(jsonString([]byte(`"\ud83d\ude00\udc00x"`)), true)
	if got != `"\ud83d\ude00\udc00x"` {
		t.Errorf("got %s", got)
	}
}

func TestEnvironIsPosixEnviron(t *testing.T) {
	env := environ([]string{"A=1", "B", "A=2", "C==x", "=e"})
	want := [][2]string{{"A", "1"}, {"C", "=x"}, {"", "e"}}
	if len(env) != len(want) {
		t.Fatalf("got %q", env)
	}
	for i := range want {
		if env[i] != want[i] {
			t.Errorf("entry %d: %q, want %q", i, env[i], want[i])
		}
	}
	if got := string(encodeEnv(env)); got != "A=1\x00C==x\x00=e\x00" {
		t.Errorf("encodeEnv: %q", got)
	}
}

func TestRequestLayout(t *testing.T) {
	req := encodeRequest("bridge", []byte("A=1\x00"), []byte("{}"), 7, 0o022)
	want := append([]byte("PYCNI\x01"), 0, 0, 0, 6, 0, 0, 0, 4, 0, 0, 0, 2, 7, 0, 0, 0, 0o022)
	want = append(want, "bridgeA=1\x00{}"...)
	if !bytes.Equal(req, want) {
		t.Errorf("got %q", req)
	}
	head := []byte{'R', 0xff, 0xff, 0xff, 0xfe, 0, 0, 0, 3, 0, 0, 0, 1}
	code, out, errLen, err := replySizes(head)
	if err != nil || code != -2 || out != 3 || errLen != 1 {
		t.Errorf("replySizes: %d %d %d %v", code, out, errLen, err)
	}
	if _, _, _, err := replySizes(append([]byte{'X'}, head[1:]...)); err == nil {
		t.Error("a reply without R accepted")
	}
}

func TestTableTrust(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, tableName)
	body := `{"python": "/x/pycni-plugin", "supported": ["1.0.0"], "plugins": {"b": ["1.0.0"]}}`
	if err := os.WriteFile(path, []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
	tab, err := loadTable(path)
	if err != nil || tab.Python != "/x/pycni-plugin" || tab.speaks("other")[0] != "1.0.0" {
		t.Fatalf("a good table refused: %v", err)
	}
	if err := os.Chmod(path, 0o666); err != nil {
		t.Fatal(err)
	}
	if _, err := loadTable(path); err == nil || !strings.Contains(err.Error(), "others can write") {
		t.Errorf("a table others can write read: %v", err)
	}
	os.Chmod(path, 0o644)
	link := filepath.Join(dir, "link.json")
	os.Symlink(path, link)
	if _, err := loadTable(link); err == nil || !strings.Contains(err.Error(), "Too many levels") {
		t.Errorf("a symlinked table read: %v", err)
	}
	st := syscall.Stat_t{Mode: syscall.S_IFREG | 0o644, Uid: 4242}
	if err := trusted(&st, 0); err == nil || !strings.Contains(err.Error(), "uid 4242") {
		t.Errorf("a stranger's table trusted: %v", err)
	}
}

func TestMarkerPathRefusesUnsafeNames(t *testing.T) {
	if got := markerPath("bridge", "c1", "eth0"); got != markerDir+"/bridge@c1@eth0" {
		t.Errorf("got %q", got)
	}
	for _, c := range [][3]string{{"bridge", "", "eth0"}, {"bridge", "-c", "eth0"},
		{"bridge", "c/1", "eth0"}, {"bridge", "c1", ".."}, {"a@b", "c1", "eth0"},
		{".x", "c1", "eth0"}, {"bridge", "c1", "e\xff"}, {"bridge", strings.Repeat("c", 250), "eth0"}} {
		if got := markerPath(c[0], c[1], c[2]); got != "" {
			t.Errorf("markerPath(%q) = %q", c, got)
		}
	}
}

// fakeDaemon listens on a socket in a temp dir and answers one connection with answer.
func fakeDaemon(t *testing.T, answer []byte, closeAfter bool) (string, chan []byte) {
	path := filepath.Join(t.TempDir(), "d.sock")
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
	if err != nil {
		t.Fatal(err)
	}
	got := make(chan []byte, 1)
	go func() {
		defer ln.Close()
		conn, err := ln.AcceptUnix()
		if err != nil {
			return
		}
		defer conn.Close()
		buf := make([]byte, 1<<16)
		oob := make([]byte, 256)
		n, oobn, _, _, _ := conn.ReadMsgUnix(buf, oob)
		if msgs, err := syscall.ParseSocketControlMessage(oob[:oobn]); err == nil {
			for _, m := range msgs {
				if fds, err := syscall.ParseUnixRights(&m); err == nil {
					for _, fd := range fds {
						syscall.Close(fd)
					}
				}
			}
		}
		got <- buf[:n]
		conn.Write(answer)
	}()
	return path, got
}

func replyBytes(code int32, out, errOut string) []byte {
	b := []byte{'R'}
	b = binary.BigEndian.AppendUint32(b, uint32(code))
	b = binary.BigEndian.AppendUint32(b, uint32(len(out)))
	b = binary.BigEndian.AppendUint32(b, uint32(len(errOut)))
	return append(append(b, out...), errOut...)
}

func TestDaemonPath(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("the peer check wants a root listener")
	}
	env := [][2]string{{"CNI_COMMAND", "ADD"}}
	stdin := []byte(`{"cniVersion":"0.4.0"}`)
	path, got := fakeDaemon(t, append([]byte("A"), replyBytes(3, "out", "err")...), true)
	r, why := callDaemon("loopback", env, stdin, path)
	if why != "" || string(r.stdout) != "out" || string(r.stderr) != "err" || r.code != 3 {
		t.Fatalf("relayed %+v, %q", r, why)
	}
	if req := <-got; !bytes.HasPrefix(req, []byte(magic)) || !bytes.HasSuffix(req, stdin) {
		t.Errorf("the daemon got %q", req)
	}
	// a refusal: not run, its message kept
	path, _ = fakeDaemon(t, replyBytes(1, `{"code": 5, "msg": "busy"}`, ""), true)
	if r, why := callDaemon("loopback", env, stdin, path); r != nil || why != "it refused the request: busy" {
		t.Errorf("refusal: %+v %q", r, why)
	}
	// closed before the ACK: not run
	path, _ = fakeDaemon(t, nil, true)
	if r, why := callDaemon("loopback", env, stdin, path); r != nil ||
		why != "it closed the connection before it took the request" {
		t.Errorf("closed: %+v %q", r, why)
	}
	// ACK, then a cut reply: it may have run, so 11 and never a second run
	path, _ = fakeDaemon(t, append([]byte("A"), replyBytes(0, "out", "")[:5]...), true)
	r, why = callDaemon("loopback", env, stdin, path)
	if why != "" || r.code != 1 || !bytes.Contains(r.stdout, []byte("stopped while running")) ||
		!bytes.Contains(r.stdout, []byte(`"cniVersion": "0.4.0"`)) {
		t.Errorf("lost: %+v %q", r, why)
	}
	// nobody there
	_, why = callDaemon("loopback", env, stdin, filepath.Join(t.TempDir(), "none"))
	if why != "connect: No such file or directory" {
		t.Errorf("missing socket: %q", why)
	}
}

func TestReadExactStopsAtTheEnd(t *testing.T) {
	if _, err := readExact(bytes.NewReader([]byte("abc")), 1<<40); err == nil {
		t.Error("a short read accepted")
	}
	if b, err := readExact(bytes.NewReader([]byte("abcd")), 3); err != nil || string(b) != "abc" {
		t.Errorf("got %q %v", b, err)
	}
}
