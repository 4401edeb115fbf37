package main

// cni.deleted.already_clean: a DEL with an empty CNI_NETNS of an attachment a DEL cleaned less
// than TTL ago answers success at once (containerd 1.6 sends every DEL chain twice).

import (
	"strings"
	"syscall"
	"time"
	"unicode/utf8"
)

const (
	markerDir = "/run/pycni/deleted"
	markerTTL = 600 * time.Second
	idChars   = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_.-"
)

// markerPath is deleted._path: "" when the names cannot make a safe single file name.
func markerPath(plugin, containerID, ifname string) string {
	if containerID == "" || strings.ContainsAny(containerID[:1], "_.-") {
		return ""
	}
	for _, c := range containerID {
		if !strings.ContainsRune(idChars, c) {
			return ""
		}
	}
	if ifname == "" || ifname == "." || ifname == ".." || strings.ContainsAny(ifname, "/\x00") {
		return ""
	}
	if plugin == "" || strings.ContainsAny(plugin, "/@") || strings.HasPrefix(plugin, ".") {
		return ""
	}
	name := plugin + "@" + containerID + "@" + ifname
	if !utf8.ValidString(name) || len(name) > 255 { // Python's encode() fails on the first
		return ""
	}
	return markerDir + "/" + name
}

// alreadyClean is deleted.already_clean.
func alreadyClean(plugin string, env [][2]string, now time.Time) bool {
	if getenv(env, "CNI_COMMAND") != "DEL" || getenv(env, "CNI_NETNS") != "" ||
		getenv(env, "CNI_PATH") == "" {
		return false
	}
	path := markerPath(plugin, getenv(env, "CNI_CONTAINERID"), getenv(env, "CNI_IFNAME"))
	if path == "" {
		return false
	}
	var st syscall.Stat_t
	if syscall.Lstat(path, &st) != nil {
		return false
	}
	mtime := time.Unix(st.Mtim.Sec, st.Mtim.Nsec)
	return now.Sub(mtime) < markerTTL && st.Uid == 0 && st.Mode&syscall.S_IFMT == syscall.S_IFREG
}
