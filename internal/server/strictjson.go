package server

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/dynamicpb"
)

// strictJSON is the JSON codec of every handler. It decodes with protojson
// as connect's own codec does, but refuses unknown fields and enum names
// instead of dropping them: a typo must not turn into a default. When
// protojson refuses a body, the error is rebuilt by walking the JSON along
// the message's descriptor, so that it names the field path
// ("keyspace.lease_ttl") and says what the field accepts. Field names may
// be lowerCamel or snake_case, as protojson has them.
type strictJSON struct{ name string }

// strictJSONCodecs replace connect's JSON codecs of both names.
var strictJSONCodecs = []strictJSON{{"json"}, {"json; charset=utf-8"}}

func (c strictJSON) Name() string { return c.name }

func (c strictJSON) Marshal(msg any) ([]byte, error) {
	m, ok := msg.(proto.Message)
	if !ok {
		return nil, fmt.Errorf("marshal %T: not a protobuf message", msg)
	}
	return protojson.Marshal(m)
}

func (c strictJSON) Unmarshal(data []byte, msg any) error {
	m, ok := msg.(proto.Message)
	if !ok {
		return fmt.Errorf("unmarshal into %T: not a protobuf message", msg)
	}
	return decodeStrict(data, m)
}

// decodeStrict decodes data into m, refusing what protojson refuses with
// DiscardUnknown off; the error names the field and what it accepts.
func decodeStrict(data []byte, m proto.Message) error {
	if len(bytes.TrimSpace(data)) == 0 {
		return errors.New("empty body; send a JSON object ({} for a request without fields)")
	}
	err := protojson.Unmarshal(data, m)
	if err == nil {
		return nil
	}
	var v any
	if jerr := json.Unmarshal(data, &v); jerr != nil {
		var syn *json.SyntaxError
		if errors.As(jerr, &syn) {
			return fmt.Errorf("the body is not valid JSON: %v, at byte %d", syn, syn.Offset)
		}
		return fmt.Errorf("the body is not valid JSON: %v", jerr)
	}
	if werr := explainMessage(data, m.ProtoReflect().Descriptor(), ""); werr != nil {
		return werr
	}
	// protojson found what the walk did not; its words are the best there are.
	msg := err.Error()
	for _, p := range []string{"proto: ", "proto:\u00a0"} {
		msg = strings.TrimPrefix(msg, p)
	}
	return errors.New(msg)
}

// explainMessage walks raw, the JSON of a message of type md at path, and
// returns the first thing protojson would refuse in it, or nil.
func explainMessage(raw []byte, md protoreflect.MessageDescriptor, path string) error {
	if wellKnown(md) {
		return nil // checked as a whole by the caller (leafCheck)
	}
	dec := json.NewDecoder(bytes.NewReader(raw))
	tok, err := dec.Token()
	if err != nil {
		return nil
	}
	if d, ok := tok.(json.Delim); !ok || d != '{' {
		return fmt.Errorf("%s: %s is not a %s; want a JSON object", pathOr(path), show(raw), md.Name())
	}
	fields := md.Fields()
	seen := map[protoreflect.FieldNumber]string{}
	oneofs := map[protoreflect.FullName]string{}
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return nil
		}
		key, _ := tok.(string)
		var val json.RawMessage
		if err := dec.Decode(&val); err != nil {
			return nil
		}
		fd := fields.ByJSONName(key)
		if fd == nil {
			fd = fields.ByTextName(key)
		}
		if fd == nil {
			return unknownField(md, join(path, key), key)
		}
		p := join(path, string(fd.Name()))
		if prev, dup := seen[fd.Number()]; dup {
			return fmt.Errorf("%s: set twice (as %q and %q); set it once", p, prev, key)
		}
		seen[fd.Number()] = key
		if od := fd.ContainingOneof(); od != nil && !od.IsSynthetic() && !isNull(val) {
			if other, ok := oneofs[od.FullName()]; ok {
				return fmt.Errorf("%s: %s is set too, and only one of them may be; choose one", p, join(path, other))
			}
			oneofs[od.FullName()] = string(fd.Name())
		}
		if err := explainField(val, fd, p); err != nil {
			return err
		}
	}
	return nil
}

// explainField checks the JSON value of field fd at path.
func explainField(val json.RawMessage, fd protoreflect.FieldDescriptor, path string) error {
	if isNull(val) {
		return nil // protojson reads null as the field's default
	}
	switch {
	case fd.IsList():
		var elems []json.RawMessage
		if json.Unmarshal(val, &elems) != nil {
			return fmt.Errorf("%s: %s is not a list; want a JSON array of %s", path, show(val), want(fd))
		}
		for i, e := range elems {
			p := fmt.Sprintf("%s[%d]", path, i)
			if isNull(e) {
				return fmt.Errorf("%s: null in a list; leave the entry out", p)
			}
			if err := explainValue(e, fd, fd, p, func(v []byte) []byte { return wrap('[', v, ']') }); err != nil {
				return err
			}
		}
		return nil
	case fd.IsMap():
		dec := json.NewDecoder(bytes.NewReader(val))
		if tok, _ := dec.Token(); tok != json.Delim('{') {
			return fmt.Errorf("%s: %s is not a map; want a JSON object of %s keys to %s", path, show(val), want(fd.MapKey()), want(fd.MapValue()))
		}
		for dec.More() {
			tok, _ := dec.Token()
			key, _ := tok.(string)
			var v json.RawMessage
			if dec.Decode(&v) != nil {
				return nil
			}
			p := fmt.Sprintf("%s[%q]", path, key)
			qkey, _ := json.Marshal(key)
			entry := func(v []byte) []byte { return wrap('{', append(append(qkey, ':'), v...), '}') }
			if err := explainValue(v, fd, fd.MapValue(), p, entry); err != nil {
				return err
			}
			if leafCheck(fd, entry(v)) != nil {
				return fmt.Errorf("%s: the key is not accepted; want %s keys", p, want(fd.MapKey()))
			}
		}
		return nil
	}
	return explainValue(val, fd, fd, path, func(v []byte) []byte { return v })
}

// explainValue checks one value of the field holder at path: a list
// element, a map value or the field's value, described by vd (holder
// itself, or its map value). in builds the JSON of holder with just this
// value, for leafCheck.
func explainValue(val json.RawMessage, holder, vd protoreflect.FieldDescriptor, path string, in func([]byte) []byte) error {
	if (vd.Kind() == protoreflect.MessageKind || vd.Kind() == protoreflect.GroupKind) && !wellKnown(vd.Message()) {
		return explainMessage(val, vd.Message(), path)
	}
	if vd.Kind() == protoreflect.EnumKind {
		var name string
		if json.Unmarshal(val, &name) == nil && vd.Enum().Values().ByName(protoreflect.Name(name)) == nil {
			return fmt.Errorf("%s: %q is not a %s%s; want %s", path, name, vd.Enum().Name(), enumGuess(vd.Enum(), name), want(vd))
		}
	}
	if leafCheck(holder, in(val)) != nil {
		return fmt.Errorf("%s: %s is not accepted%s; want %s", path, show(val), durationHint(vd, val), want(vd))
	}
	return nil
}

// leafCheck asks protojson whether it takes val as the JSON of field fd,
// alone in a message of fd's type.
func leafCheck(fd protoreflect.FieldDescriptor, val []byte) error {
	name, _ := json.Marshal(fd.JSONName())
	body := wrap('{', append(append(name, ':'), val...), '}')
	return protojson.Unmarshal(body, dynamicpb.NewMessage(fd.ContainingMessage()))
}

// wellKnown reports whether md is a google.protobuf type with a JSON form
// of its own (Duration, Timestamp, wrappers, Struct, ...).
func wellKnown(md protoreflect.MessageDescriptor) bool {
	return md.ParentFile() != nil && md.ParentFile().Package() == "google.protobuf"
}

// want says what field fd accepts in JSON.
func want(fd protoreflect.FieldDescriptor) string {
	switch fd.Kind() {
	case protoreflect.BoolKind:
		return "true or false"
	case protoreflect.StringKind:
		return "a JSON string"
	case protoreflect.BytesKind:
		return "base64 in a JSON string"
	case protoreflect.Int32Kind, protoreflect.Sint32Kind, protoreflect.Sfixed32Kind:
		return "a whole number from -2147483648 to 2147483647"
	case protoreflect.Uint32Kind, protoreflect.Fixed32Kind:
		return "a whole number from 0 to 4294967295"
	case protoreflect.Int64Kind, protoreflect.Sint64Kind, protoreflect.Sfixed64Kind:
		return `a whole number, as a JSON string or number, like "12"`
	case protoreflect.Uint64Kind, protoreflect.Fixed64Kind:
		return `a whole number >= 0, as a JSON string or number, like "12"`
	case protoreflect.FloatKind, protoreflect.DoubleKind:
		return `a number ("NaN", "Infinity" and "-Infinity" as strings)`
	case protoreflect.EnumKind:
		var names []string
		vals := fd.Enum().Values()
		for i := range vals.Len() {
			names = append(names, string(vals.Get(i).Name()))
		}
		return "one of " + strings.Join(names, ", ")
	}
	switch fd.Message().FullName() {
	case "google.protobuf.Duration":
		return `a duration in seconds with an "s" suffix, like "10s" or "1.5s"`
	case "google.protobuf.Timestamp":
		return `an RFC 3339 time, like "2026-05-06T07:00:00Z"`
	}
	return "a JSON object (" + string(fd.Message().Name()) + ")"
}

// durationHint shows a Go-style duration ("1000h") in the form a
// Duration takes.
func durationHint(fd protoreflect.FieldDescriptor, val []byte) string {
	if fd.Kind() != protoreflect.MessageKind || fd.Message().FullName() != "google.protobuf.Duration" {
		return ""
	}
	var s string
	if json.Unmarshal(val, &s) != nil {
		return ""
	}
	d, err := time.ParseDuration(s)
	if err != nil {
		return ""
	}
	return fmt.Sprintf(" (%s is %q)", s, strconv.FormatFloat(d.Seconds(), 'f', -1, 64)+"s")
}

func unknownField(md protoreflect.MessageDescriptor, path, key string) error {
	fields := md.Fields()
	var names []string
	best, bestDist := "", 3
	for i := range fields.Len() {
		fd := fields.Get(i)
		names = append(names, string(fd.Name()))
		name := string(fd.Name())
		if strings.ContainsAny(key, "ABCDEFGHIJKLMNOPQRSTUVWXYZ") {
			name = fd.JSONName() // answer in the style the caller writes
		}
		if d := editDistance(fold(key), fold(name)); d < bestDist && d < max(len(key)/2, 1) {
			best, bestDist = name, d
		}
	}
	if best != "" {
		return fmt.Errorf("%s: unknown field; did you mean %q? (%s has %s)", path, best, md.Name(), strings.Join(names, ", "))
	}
	if len(names) == 0 {
		return fmt.Errorf("%s: unknown field; %s has no fields: send {}", path, md.Name())
	}
	return fmt.Errorf("%s: unknown field; %s has %s", path, md.Name(), strings.Join(names, ", "))
}

// enumGuess suggests the value of ed that name most likely meant: the one
// it is the suffix of ("EXCLUSIVE"), or one a typo away.
func enumGuess(ed protoreflect.EnumDescriptor, name string) string {
	vals := ed.Values()
	best, bestDist := "", 3
	for i := range vals.Len() {
		v := string(vals.Get(i).Name())
		d := editDistance(fold(name), fold(v))
		if name != "" && strings.HasSuffix(fold(v), fold(name)) {
			d = 0
		}
		if d < bestDist && d < max(len(name)/2, 1) {
			best, bestDist = v, d
		}
	}
	if best == "" {
		return ""
	}
	return fmt.Sprintf(" (did you mean %q?)", best)
}

// fold lowercases s and drops underscores: "leaseTTL" and "lease_ttl"
// fold alike.
func fold(s string) string { return strings.ReplaceAll(strings.ToLower(s), "_", "") }

// editDistance is the Levenshtein distance of a and b, in bytes.
func editDistance(a, b string) int {
	if len(a) > 64 || len(b) > 64 {
		return 64 // no guesses for long names
	}
	prev := make([]int, len(b)+1)
	cur := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
		}
		prev, cur = cur, prev
	}
	return prev[len(b)]
}

func isNull(raw []byte) bool { return bytes.Equal(bytes.TrimSpace(raw), []byte("null")) }

func join(path, name string) string {
	if path == "" {
		return name
	}
	return path + "." + name
}

func pathOr(path string) string {
	if path == "" {
		return "the body"
	}
	return path
}

// show quotes a JSON value for an error, cut to 40 bytes.
func show(raw []byte) string {
	s := string(bytes.TrimSpace(raw))
	if len(s) > 40 {
		s = s[:40] + "..."
	}
	return s
}

func wrap(open byte, v []byte, end byte) []byte {
	out := make([]byte, 0, len(v)+2)
	out = append(out, open)
	out = append(out, v...)
	return append(out, end)
}
