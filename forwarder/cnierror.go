package main

// CNI errors as the shim prints them (protocol.error_reply): CNIError.to_json, i.e. Python's
// json.dumps(..., indent=4) with its default ensure_ascii, in the version skel would print an
// error in (protocol.config_version). Byte for byte: the differential test compares them.

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"strconv"
	"unicode/utf16"
	"unicode/utf8"
)

const (
	current          = "1.1.0" // cni.spec.version.CURRENT
	defaultIfMissing = "0.1.0" // cni.spec.version.DEFAULT_IF_MISSING
)

// pyString is json.dumps(s) for a str made from these bytes as Python makes env values and
// strerror texts (UTF-8, surrogateescape): ASCII printable kept, '"' and '\\' escaped, the
// rest \uXXXX (lowercase hex, surrogate pairs above U+FFFF), a byte that is not UTF-8 as the
// lone surrogate U+DC80+byte that surrogateescape makes of it.
func pyString(s string) string {
	var b bytes.Buffer
	b.WriteByte('"')
	for i := 0; i < len(s); {
		r, size := utf8.DecodeRuneInString(s[i:])
		if r == utf8.RuneError && size == 1 {
			fmt.Fprintf(&b, "\\u%04x", 0xdc00+int(s[i]))
			i++
			continue
		}
		i += size
		switch {
		case r == '"':
			b.WriteString(`\"`)
		case r == '\\':
			b.WriteString(`\\`)
		case r == '\n':
			b.WriteString(`\n`)
		case r == '\r':
			b.WriteString(`\r`)
		case r == '\t':
			b.WriteString(`\t`)
		case r == '\b':
			b.WriteString(`\b`)
		case r == '\f':
			b.WriteString(`\f`)
		case r >= 0x20 && r <= 0x7e:
			b.WriteRune(r)
		case r > 0xffff:
			hi, lo := utf16.EncodeRune(r)
			fmt.Fprintf(&b, "\\u%04x\\u%04x", hi, lo)
		default:
			fmt.Fprintf(&b, "\\u%04x", r)
		}
	}
	b.WriteByte('"')
	return b.String()
}

// errorReply is protocol.error_reply(code, msg, stdin).
func errorReply(code int, msg string, stdin []byte) []byte {
	return []byte("{\n    \"cniVersion\": " + pyString(configVersion(stdin)) +
		",\n    \"code\": " + strconv.Itoa(code) + ",\n    \"msg\": " + pyString(msg) +
		",\n    \"details\": \"\"\n}")
}

// decodeJSON is json.loads(stdin) as far as encoding/json agrees with it: a UTF-8 BOM skipped
// (json.loads detects utf-8-sig), bytes that are not UTF-8 refused (Python's decode fails),
// numbers kept as text (any size parses), nothing but whitespace after the value. Known
// differences, answered as a decode error here: NaN and Infinity literals, UTF-16/32 input.
func decodeJSON(stdin []byte) (interface{}, bool) {
	stdin = bytes.TrimPrefix(stdin, []byte("\xef\xbb\xbf"))
	if !utf8.Valid(stdin) {
		return nil, false
	}
	dec := json.NewDecoder(bytes.NewReader(stdin))
	dec.UseNumber()
	var v interface{}
	if err := dec.Decode(&v); err != nil {
		return nil, false
	}
	if _, err := dec.Token(); err != io.EOF {
		return nil, false // extra data
	}
	return v, true
}

// falsy is Python's truth test on a decoded JSON value.
func falsy(v interface{}) bool {
	switch x := v.(type) {
	case nil:
		return true
	case bool:
		return !x
	case string:
		return x == ""
	case json.Number:
		f, err := strconv.ParseFloat(string(x), 64)
		return err == nil && f == 0
	case []interface{}:
		return len(x) == 0
	case map[string]interface{}:
		return len(x) == 0
	}
	return false
}

// configVersion is protocol.config_version: the config's cniVersion, DEFAULT_IF_MISSING when
// it is missing or empty, CURRENT when stdin is no JSON object or the value no string.
func configVersion(stdin []byte) string {
	v, ok := decodeJSON(stdin)
	config, isMap := v.(map[string]interface{})
	if !ok || !isMap {
		return current
	}
	value := config["cniVersion"]
	if falsy(value) {
		return defaultIfMissing
	}
	if s, isStr := value.(string); isStr {
		return s
	}
	return current
}
