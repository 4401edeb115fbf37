package main

// The install's table, `.pycni-forwarder.json` beside the binary, written by
// `pycni install --forwarder` (cni/install/forwarder.py): what the Python executable bakes into
// its own text (each plugin's versions, for VERSION) and where that executable is (the
// in-process fallback). VERSION stays a function of install-time data; the file is believed only
// if nobody but root (or this process's own user) could have written it.

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"syscall"
)

const (
	tableName = ".pycni-forwarder.json"
	maxTable  = 1 << 20
)

// table is the sidecar's content.
type table struct {
	Python    string              `json:"python"`    // the Python multi-call executable
	Version   string              `json:"version"`   // pycni's, at install
	Supported []string            `json:"supported"` // cni.spec.version.SUPPORTED
	Plugins   map[string][]string `json:"plugins"`   // name -> the versions it speaks
}

// speaks is registry.supported(plugin, SUPPORTED) as the install computed it.
func (t *table) speaks(plugin string) []string {
	if v, ok := t.Plugins[plugin]; ok {
		return v
	}
	return t.Supported
}

// tablePath is the sidecar beside the running binary (its real path, not the plugin's link).
func tablePath() (string, error) {
	exe, err := os.Executable()
	if err != nil {
		return "", err
	}
	return filepath.Join(filepath.Dir(exe), tableName), nil
}

// loadTable reads and checks the sidecar: a regular file, not a symlink, owned by root or by
// this process's uid, writable by neither group nor others, valid JSON with the fields set.
func loadTable(path string) (*table, error) {
	fd, err := syscall.Open(path, syscall.O_RDONLY|syscall.O_CLOEXEC|syscall.O_NOFOLLOW|
		syscall.O_NONBLOCK, 0)
	if err != nil {
		return nil, fmt.Errorf("cannot open %s: %s", path, strerror(err))
	}
	f := os.NewFile(uintptr(fd), path)
	defer f.Close()
	var st syscall.Stat_t
	if err := syscall.Fstat(fd, &st); err != nil {
		return nil, fmt.Errorf("cannot stat %s: %s", path, strerror(err))
	}
	if err := trusted(&st, uint32(os.Geteuid())); err != nil {
		return nil, fmt.Errorf("%s %v", path, err)
	}
	buf := make([]byte, maxTable+1)
	n, _ := io.ReadFull(f, buf)
	if n > maxTable {
		return nil, fmt.Errorf("%s is larger than %d bytes", path, maxTable)
	}
	var t table
	if err := json.Unmarshal(buf[:n], &t); err != nil {
		return nil, fmt.Errorf("%s is not a pycni install table: %v", path, err)
	}
	if t.Python == "" || len(t.Supported) == 0 {
		return nil, fmt.Errorf("%s is not a pycni install table: python or supported missing",
			path)
	}
	return &t, nil
}

// trusted: a regular file only root (or euid) owns and can write.
func trusted(st *syscall.Stat_t, euid uint32) error {
	if st.Mode&syscall.S_IFMT != syscall.S_IFREG {
		return errors.New("is not a regular file")
	}
	if st.Uid != 0 && st.Uid != euid {
		return fmt.Errorf("is owned by uid %d, not root", st.Uid)
	}
	if st.Mode&0o022 != 0 {
		return fmt.Errorf("has mode %04o: group or others can write it", st.Mode&0o7777)
	}
	return nil
}
