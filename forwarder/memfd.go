package main

import (
	"syscall"
	"unsafe"
)

var memfdName = []byte("pycni-stdin\x00")

// memfdCreate is memfd_create("pycni-stdin", MFD_CLOEXEC) by its syscall number.
func memfdCreate(nr uintptr) (int, error) {
	fd, _, errno := syscall.Syscall(nr, uintptr(unsafe.Pointer(&memfdName[0])), 1, 0)
	if errno != 0 {
		return -1, errno
	}
	return int(fd), nil
}
