package main

// VERSION, as shim.fast_version answers it: from the install's table (install.go), for the
// stdin shapes runtimes send; any other stdin is skel's (the Python executable), or, without
// it, version_info's answer computed here.

import (
	"bytes"
	"strings"
)

const jsonWS = " \t\n\r"

// askedVersion is shim.asked_version: the version VERSION echoes for stdin "", "{}" or
// {"cniVersion": "<plain>"}; ok false for any other shape (skel decides those).
func askedVersion(stdin []byte, speaks []string) (string, bool) {
	body := bytes.Trim(stdin, jsonWS)
	if len(body) == 0 {
		return current, true
	}
	if body[0] != '{' || body[len(body)-1] != '}' {
		return "", false
	}
	inner := bytes.Trim(body[1:len(body)-1], jsonWS)
	if len(inner) == 0 {
		return current, true
	}
	colon := bytes.IndexByte(inner, ':')
	if colon < 0 {
		return "", false
	}
	key := bytes.TrimRight(inner[:colon], jsonWS)
	value := bytes.Trim(inner[colon+1:], jsonWS)
	if string(key) != `"cniVersion"` || len(value) < 2 {
		return "", false
	}
	text := value[1 : len(value)-1]
	if value[0] != '"' || value[len(value)-1] != '"' || bytes.ContainsAny(text, "\"\\") {
		return "", false
	}
	for _, c := range text {
		if c < 0x20 || c >= 0x7f {
			return "", false
		}
	}
	return echoed(string(text), speaks), true
}

func echoed(version string, speaks []string) string {
	for _, v := range speaks {
		if v == version {
			return version
		}
	}
	return current
}

// versionReply is the JSON both fast_version and skel.version_info print.
func versionReply(asked string, speaks []string) []byte {
	quoted := make([]string, len(speaks))
	for i, v := range speaks {
		quoted[i] = `"` + v + `"`
	}
	return []byte(`{"cniVersion": "` + asked + `", "supportedVersions": [` +
		strings.Join(quoted, ", ") + `]}`)
}

// versionInfo is skel.version_info for any stdin (json.loads(stdin or "{}").get("cniVersion")),
// for when no Python executable can be asked.
func versionInfo(stdin []byte, speaks []string) []byte {
	if len(stdin) == 0 {
		stdin = []byte("{}")
	}
	asked := current
	if v, ok := decodeJSON(stdin); ok {
		if config, isMap := v.(map[string]interface{}); isMap {
			if s, isStr := config["cniVersion"].(string); isStr {
				asked = echoed(s, speaks)
			}
		}
	}
	return versionReply(asked, speaks)
}
