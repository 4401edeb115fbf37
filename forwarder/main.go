// Command pycni-forwarder is the plugin executable of `pycni install --forwarder`: a static
// binary that speaks cni/fast/shim.py's protocol to the pycni daemon byte for byte, so no
// Python starts on a call the daemon takes. docs/DESIGN.md ("The forwarder") says what it does
// and how install lays it out; shim.py is the reference every function here names.
package main

import (
	"io"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"
	"unsafe"
)

func main() {
	signal.Ignore(syscall.SIGPIPE) // as Python: a reader gone is EPIPE, the exit code still tells
	os.Exit(run(os.Args[0], os.Environ()))
}

// run is shim.main: the reply written out, its exit code returned (unless the request goes to
// the Python executable, which then replaces this process).
func run(argv0 string, rawEnv []string) int {
	plugin := argv0[strings.LastIndexByte(argv0, '/')+1:]
	env := environ(rawEnv)
	command := getenv(env, "CNI_COMMAND")
	stdin := readStdin()
	var r *reply
	why := "pycni-forwarder hands " + pyRepr(command) + " to skel"
	switch {
	case command == "VERSION":
		r = version(plugin, stdin, rawEnv)
	case command == "DEL" && getenv(env, "CNI_NETNS") == "" &&
		alreadyClean(plugin, env, time.Now()):
		r = &reply{} // containerd's second DEL: skel.run would answer the same
	case daemonCommands[command] && len(stdin) <= maxStdin:
		path := getenv(env, socketEnv)
		if path == "" {
			path = defaultSock
		}
		answer, notrun := callDaemon(plugin, env, stdin, path)
		switch {
		case answer != nil:
			r = answer
		case getenv(env, fallbackEnv) == "0":
			r = noDaemon(stdin, path, notrun)
		default:
			why = "no pycni daemon took the request on " + path + " (" + string(notrun) + ")"
		}
	}
	if r == nil {
		r = inProcess(plugin, stdin, rawEnv, why)
	}
	write(1, r.stdout)
	write(2, r.stderr)
	return r.code
}

// version answers VERSION from the install's table; stdin of a shape only skel decides goes to
// the Python executable, or without it to versionInfo.
func version(plugin string, stdin []byte, rawEnv []string) *reply {
	t, err := installTable()
	if err != nil {
		return &reply{errorReply(tryAgainCode, "pycni-forwarder cannot answer VERSION: "+
			err.Error(), stdin), nil, 1}
	}
	speaks := t.speaks(plugin)
	if asked, ok := askedVersion(stdin, speaks); ok {
		return &reply{versionReply(asked, speaks), nil, 0}
	}
	_ = execPython(t.Python, plugin, stdin, rawEnv) // returns only if it could not exec
	return &reply{versionInfo(stdin, speaks), nil, 0}
}

func installTable() (*table, error) {
	path, err := tablePath()
	if err != nil {
		return nil, err
	}
	return loadTable(path)
}

// inProcess runs the request through the Python executable's in-process path (this process
// becomes it); without it, error 11 naming why.
func inProcess(plugin string, stdin []byte, rawEnv []string, why string) *reply {
	t, err := installTable()
	reason := ""
	if err != nil {
		reason = err.Error()
	} else {
		reason = execPython(t.Python, plugin, stdin, rawEnv)
	}
	msg := why + ", and pycni's Python cannot run it in-process: " + reason
	return &reply{errorReply(tryAgainCode, msg, stdin), nil, 1}
}

// noDaemon is shim.no_daemon: nothing ran and the fallback is off.
func noDaemon(stdin []byte, path string, why notRun) *reply {
	msg := "no pycni daemon took the request on " + path + " (" + string(why) + "), and " +
		fallbackEnv + "=0 forbids running it in-process"
	return &reply{errorReply(tryAgainCode, msg, stdin), nil, 1}
}

// pyRepr quotes a name for a message ('ADD').
func pyRepr(s string) string { return "'" + s + "'" }

// readStdin is shim.read_stdin: nothing from a terminal, everything else to EOF, nothing at
// all if reading fails.
func readStdin() []byte {
	var termios syscall.Termios
	if _, _, e := syscall.Syscall(syscall.SYS_IOCTL, 0, syscall.TCGETS,
		uintptr(unsafe.Pointer(&termios))); e == 0 {
		return nil
	}
	data, err := io.ReadAll(os.NewFile(0, "stdin"))
	if err != nil {
		return nil
	}
	return data
}

// write is shim.write: all of data, unless the reader went away.
func write(fd int, data []byte) {
	for len(data) > 0 {
		n, err := syscall.Write(fd, data)
		if err == syscall.EINTR {
			continue
		}
		if err != nil || n <= 0 {
			return
		}
		data = data[n:]
	}
}
