package main

// The in-process path: the request handed to the Python executable the install wrote
// (`pycni-plugin --pycni-in-process <plugin>`), which runs the shim's in-process path (skel.run)
// with the same environment and the same stdin (read already: given back as a memfd, or an
// unlinked temporary file where memfd_create is not known here). Nothing of this process
// survives the exec.

import (
	"os"
	"syscall"
)

const inProcessFlag = "--pycni-in-process"

// execPython replaces this process with the Python executable's in-process path; it returns
// only why it could not.
func execPython(python, plugin string, stdin []byte, rawEnv []string) string {
	var st syscall.Stat_t
	if err := syscall.Stat(python, &st); err != nil {
		return "the Python executable " + python + " is not there: " + strerror(err)
	}
	if interp := interpreter(python); interp != "" {
		if err := syscall.Access(interp, 1 /* X_OK */); err != nil {
			return "pycni's interpreter " + interp + " (named by " + python +
				") cannot run: " + strerror(err)
		}
	}
	fd, err := stdinFile(stdin)
	if err != nil {
		return "cannot pass stdin on: " + strerror(err)
	}
	if fd == 0 { // stdin was closed: the file took its number, only close-on-exec to clear
		_, _, errno := syscall.Syscall(syscall.SYS_FCNTL, 0, syscall.F_SETFD, 0)
		if errno != 0 {
			return "cannot pass stdin on: " + strerror(errno)
		}
	} else if err := syscall.Dup3(fd, 0, 0); err != nil {
		return "cannot pass stdin on: " + strerror(err)
	}
	err = syscall.Exec(python, []string{python, inProcessFlag, plugin}, rawEnv)
	return "cannot exec " + python + ": " + strerror(err)
}

// interpreter is the path on the executable's #! line ("" if it has none).
func interpreter(path string) string {
	f, err := os.Open(path)
	if err != nil {
		return ""
	}
	defer f.Close()
	head := make([]byte, 256)
	n, _ := f.Read(head)
	head = head[:n]
	if len(head) < 2 || string(head[:2]) != "#!" {
		return ""
	}
	line := head[2:]
	for i, c := range line {
		if c == '\n' {
			line = line[:i]
			break
		}
	}
	for i, c := range line {
		if c == ' ' || c == '\t' {
			return string(line[:i])
		}
	}
	return string(line)
}

// stdinFile is a file holding stdin, at offset 0, without close-on-exec once dup'd to 0.
func stdinFile(stdin []byte) (int, error) {
	fd, err := memfd()
	if err != nil {
		f, ferr := os.CreateTemp("", ".pycni-stdin-")
		if ferr != nil {
			return -1, ferr
		}
		_ = os.Remove(f.Name())
		fd, err = syscall.Dup(int(f.Fd()))
		f.Close()
		if err != nil {
			return -1, err
		}
	}
	for off := 0; off < len(stdin); {
		n, err := syscall.Write(fd, stdin[off:])
		if err != nil {
			return -1, err
		}
		off += n
	}
	if _, err := syscall.Seek(fd, 0, 0); err != nil {
		return -1, err
	}
	return fd, nil
}
