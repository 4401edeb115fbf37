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
	return pyQuote(s, false)
}

// pyQuote is pyString; wtf8: s comes from jsonString, where ED A0-BF xx is a lone surrogate
// a \u escape made (Python's str keeps it, and json.dumps writes it back as \udXXX).
func pyQuote(s string, wtf8 bool) string {
	var b bytes.Buffer
	b.WriteByte('"')
	for i := 0; i < len(s); {
		if wtf8 && i+2 < len(s) && s[i] == 0xed && s[i+1] >= 0xa0 && s[i+1] <= 0xbf &&
			s[i+2] >= 0x80 && s[i+2] <= 0xbf {
			fmt.Fprintf(&b, "\\u%04x", 0xd000|int(s[i+1]&0x3f)<<6|int(s[i+2]&0x3f))
			i += 3
			continue
		}
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
	return []byte("{\n    \"cniVersion\": " + pyQuote(configVersion(stdin), true) +
		",\n    \"code\": " + strconv.Itoa(code) + ",\n    \"msg\": " + pyString(msg) +
		",\n    \"details\": \"\"\n}")
}

// validWTF8: UTF-8, surrogates allowed (json.loads decodes bytes with "surrogatepass").
func validWTF8(b []byte) bool {
	for i := 0; i < len(b); {
		r, size := utf8.DecodeRune(b[i:])
		if r == utf8.RuneError && size == 1 {
			if i+2 < len(b) && b[i] == 0xed && b[i+1] >= 0xa0 && b[i+1] <= 0xbf &&
				b[i+2] >= 0x80 && b[i+2] <= 0xbf {
				i += 3
				continue
			}
			return false
		}
		i += size
	}
	return true
}

// decodeJSON is json.loads(stdin) as far as encoding/json agrees with it: a UTF-8 BOM skipped
// (json.loads detects utf-8-sig), bytes that are not UTF-8 refused (Python's decode fails),
// numbers kept as text (any size parses), nothing but whitespace after the value. Known
// differences, answered as a decode error here: NaN and Infinity literals, UTF-16/32 input.
// (Strings it decodes with U+FFFD for a surrogate: configVersion reads its string itself.)
func decodeJSON(stdin []byte) (interface{}, bool) {
	stdin = bytes.TrimPrefix(stdin, []byte("\xef\xbb\xbf"))
	if !validWTF8(stdin) {
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
// it is missing or empty, CURRENT when stdin is no JSON object or the value no string. A string
// is unescaped here (jsonString), not by encoding/json, which makes U+FFFD of a lone surrogate.
func configVersion(stdin []byte) string {
	v, ok := decodeJSON(stdin)
	if _, isMap := v.(map[string]interface{}); !ok || !isMap {
		return current
	}
	var raw map[string]json.RawMessage
	if json.Unmarshal(bytes.TrimPrefix(stdin, []byte("\xef\xbb\xbf")), &raw) != nil {
		return current
	}
	token, found := raw["cniVersion"]
	if !found {
		return defaultIfMissing
	}
	if len(token) > 0 && token[0] == '"' {
		if s := jsonString(token); s != "" {
			return s
		}
		return defaultIfMissing
	}
	var value interface{}
	dec := json.NewDecoder(bytes.NewReader(token))
	dec.UseNumber()
	if dec.Decode(&value) != nil || falsy(value) {
		return defaultIfMissing
	}
	return current
}

// jsonString unescapes a valid JSON string token as Python's json does: a \u escape of a
// lone surrogate kept (as its 3-byte WTF-8 form, for pyQuote), a pair joined.
func jsonString(token []byte) string {
	in := token[1 : len(token)-1]
	var b []byte
	for i := 0; i < len(in); i++ {
		c := in[i]
		if c != '\\' {
			b = append(b, c)
			continue
		}
		i++
		switch in[i] {
		case 'b':
			b = append(b, '\b')
		case 'f':
			b = append(b, '\f')
		case 'n':
			b = append(b, '\n')
		case 'r':
			b = append(b, '\r')
		case 't':
			b = append(b, '\t')
		case 'u':
			r := hex4(in[i+1 : i+5])
			i += 4
			if utf16.IsSurrogate(r) && r < 0xdc00 && i+6 < len(in) && in[i+1] == '\\' &&
				in[i+2] == 'u' {
				if lo := hex4(in[i+3 : i+7]); lo >= 0xdc00 && lo <= 0xdfff {
					b = utf8.AppendRune(b, utf16.DecodeRune(r, lo))
					i += 6
					continue
				}
			}
			if utf16.IsSurrogate(r) {
				b = append(b, 0xed, byte(0x80|(r>>6)&0x3f), byte(0x80|r&0x3f))
			} else {
				b = utf8.AppendRune(b, r)
			}
		default: // " \\ /
			b = append(b, in[i])
		}
	}
	return string(b)
}

func hex4(h []byte) rune {
	n, _ := strconv.ParseUint(string(h), 16, 32)
	return rune(n)
}
