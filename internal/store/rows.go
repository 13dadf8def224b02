package store

import (
	"encoding/json"
	"errors"
	"reflect"
	"slices"
	"strings"
	"sync"
)

// Every watcher decodes every record the leader writes: a grant round
// that moves a third of a 256-bucket keyspace rewrites two or three
// members' grants and held copies, and serve's view, the leader and any
// other watch decode each. Through encoding/json's token stream and a
// json.RawMessage per number, a member's grants of 128 buckets took about
// 110 µs and 800 allocations to decode, on the path of every handoff.
// decodePlain takes the common case in one pass and leaves anything
// unusual to the strict token stream, so that errors stay the same.

// decodePlain decodes data into v, a pointer to a struct whose JSON names
// are exactly fields, if data is plain: one JSON object whose keys are
// distinct members of fields written without escapes, whose rows
// (uintRows) hold only plain non-negative integers, followed by nothing
// but white space. It reads the keys and rows itself and hands each other
// value to json.Unmarshal, which checks it. It reports false, with v
// zeroed, for anything else, which decodeStrict's token stream then
// judges and names.
func decodePlain(data []byte, fields []string, v any) bool {
	rv := reflect.ValueOf(v)
	if rv.Kind() != reflect.Pointer || rv.Elem().Kind() != reflect.Struct || len(fields) > 64 {
		return false
	}
	rv = rv.Elem()
	if !readPlain(data, fields, rv, jsonFields(rv.Type())) {
		rv.SetZero()
		return false
	}
	return true
}

func readPlain(data []byte, fields []string, rv reflect.Value, index map[string]int) bool {
	var seen uint64
	i := skipSpace(data, 0)
	if i >= len(data) || data[i] != '{' {
		return false
	}
	i = skipSpace(data, i+1)
	if i < len(data) && data[i] == '}' {
		return skipSpace(data, i+1) == len(data)
	}
	for {
		if i >= len(data) || data[i] != '"' {
			return false
		}
		j := i + 1
		for j < len(data) && data[j] != '"' && data[j] != '\\' && data[j] >= 0x20 {
			j++
		}
		if j >= len(data) || data[j] != '"' {
			return false // an escape: the strict path compares the decoded name
		}
		name := data[i+1 : j]
		k := slices.IndexFunc(fields, func(f string) bool { return f == string(name) })
		fi, ok := index[string(name)]
		if k < 0 || !ok || seen&(1<<k) != 0 {
			return false
		}
		seen |= 1 << k
		i = skipSpace(data, j+1)
		if i >= len(data) || data[i] != ':' {
			return false
		}
		i = skipSpace(data, i+1)
		var end int
		f := rv.Field(fi)
		if rows, isRows := f.Addr().Interface().(*uintRows); isRows {
			end, ok = rows.readPlain(data, i)
		} else if s, e, plain := plainString(data, i); plain && f.Type() == reflect.TypeFor[string]() {
			f.SetString(s) // as json.Unmarshal would: valid UTF-8, nothing to unescape
			end = e
		} else {
			end, ok = skipValue(data, i)
			ok = ok && json.Unmarshal(data[i:end], f.Addr().Interface()) == nil
		}
		if !ok {
			return false
		}
		i = skipSpace(data, end)
		if i >= len(data) {
			return false
		}
		switch data[i] {
		case '}':
			return skipSpace(data, i+1) == len(data)
		case ',':
			i = skipSpace(data, i+1)
		default:
			return false
		}
	}
}

// jsonFields maps the JSON names of struct type t's fields to their
// indexes, once per type.
func jsonFields(t reflect.Type) map[string]int {
	if m, ok := fieldIndexes.Load(t); ok {
		return m.(map[string]int)
	}
	m := map[string]int{}
	for i := range t.NumField() {
		f := t.Field(i)
		name, opts, _ := strings.Cut(f.Tag.Get("json"), ",")
		// A field with ",string" holds its value quoted: the token
		// stream decodes it.
		if f.IsExported() && name != "" && name != "-" && !slices.Contains(strings.Split(opts, ","), "string") {
			m[name] = i
		}
	}
	fieldIndexes.Store(t, m)
	return m
}

var fieldIndexes sync.Map // reflect.Type → map[string]int

func skipSpace(data []byte, i int) int {
	for i < len(data) && (data[i] == ' ' || data[i] == '\t' || data[i] == '\n' || data[i] == '\r') {
		i++
	}
	return i
}

// skipValue returns the index just past the JSON value starting at
// data[i], or false if data ends first. It finds the value's end without
// checking its syntax.
func skipValue(data []byte, i int) (int, bool) {
	if i >= len(data) {
		return i, false
	}
	switch data[i] {
	case '"':
		return skipString(data, i)
	case '[', '{':
		depth := 0
		for i < len(data) {
			switch data[i] {
			case '"':
				var ok bool
				if i, ok = skipString(data, i); !ok {
					return i, false
				}
				continue
			case '[', '{':
				depth++
			case ']', '}':
				depth--
				if depth == 0 {
					return i + 1, true
				}
			}
			i++
		}
		return i, false
	}
	for i < len(data) {
		switch data[i] {
		case ',', ']', '}', ' ', '\t', '\n', '\r':
			return i, true
		}
		i++
	}
	return i, true
}

// plainString returns the JSON string at data[i] and the index just past
// it if it has no escape and no control character, so that its bytes
// between the quotes are its value (decodeStrict has checked that data is
// valid UTF-8). A map's owners, 175 KB at 65,536 buckets, are such a
// string.
func plainString(data []byte, i int) (string, int, bool) {
	if i >= len(data) || data[i] != '"' {
		return "", i, false
	}
	for j := i + 1; j < len(data); j++ {
		switch c := data[j]; {
		case c == '"':
			return string(data[i+1 : j]), j + 1, true
		case c == '\\' || c < 0x20:
			return "", i, false
		}
	}
	return "", i, false
}

// skipString returns the index just past the JSON string starting at
// data[i] (a quote).
func skipString(data []byte, i int) (int, bool) {
	for i++; i < len(data); i++ {
		switch data[i] {
		case '\\':
			i++
		case '"':
			return i + 1, true
		}
	}
	return i, false
}

// uintRows is a field holding rows of plain non-negative integers,
// [[1,2],[3,4],...], the form of every bucket list the records store
// (grants, releases, held copies, commit exceptions, bucket positions).
// It decodes in one pass into one slice of numbers. An element that is
// not a plain non-negative integer does not fail the decode: Err reports
// it, and the record's parser names the entry and the element's meaning.
// A row of null is a row of no elements, and a field of null no rows, as
// for [][]json.RawMessage.
type uintRows struct {
	vals []uint64
	ends []int     // row i is vals[ends[i-1]:ends[i]]
	bad  []badCell // the elements that are not plain non-negative integers (their vals are 0)
}

type badCell struct {
	at  int // index in vals
	err error
}

// Len is the number of rows.
func (r uintRows) Len() int { return len(r.ends) }

// Row returns row i's elements.
func (r uintRows) Row(i int) []uint64 {
	return r.vals[r.start(i):r.ends[i]]
}

// Err returns why element j of row i is not a plain non-negative
// integer, or nil if it is one.
func (r uintRows) Err(i, j int) error {
	at := r.start(i) + j
	for _, b := range r.bad {
		if b.at == at {
			return b.err
		}
	}
	return nil
}

func (r uintRows) start(i int) int {
	if i == 0 {
		return 0
	}
	return r.ends[i-1]
}

// UnmarshalJSON implements json.Unmarshaler, for decodeStrict's token
// stream (records that are not plain): the rows as encoding/json reads
// [][]json.RawMessage, each element parsed by uintOf.
func (r *uintRows) UnmarshalJSON(data []byte) error {
	*r = uintRows{}
	var rows [][]json.RawMessage
	if err := json.Unmarshal(data, &rows); err != nil {
		var te *json.UnmarshalTypeError
		if !errors.As(err, &te) {
			return err
		}
		want := reflect.TypeFor[[][]uint64]() // the field is not an array
		if te.Type == reflect.TypeFor[[]json.RawMessage]() {
			want = reflect.TypeFor[[]uint64]() // a row is not
		}
		return &json.UnmarshalTypeError{Value: te.Value, Type: want} // json.Unmarshal names the field
	}
	for _, row := range rows {
		for _, raw := range row {
			v, err := uintOf(raw)
			if err != nil {
				r.bad = append(r.bad, badCell{at: len(r.vals), err: err})
			}
			r.vals = append(r.vals, v)
		}
		r.ends = append(r.ends, len(r.vals))
	}
	return nil
}

// readPlain sets r from the JSON value at data[i] if it is rows of plain
// non-negative integers (null rows allowed), and returns the index just
// past it; false if the value is anything else.
func (r *uintRows) readPlain(data []byte, i int) (int, bool) {
	*r = uintRows{}
	if isNull(data, i) {
		return i + len("null"), true
	}
	if i >= len(data) || data[i] != '[' {
		return i, false
	}
	i = skipSpace(data, i+1)
	if i < len(data) && data[i] == ']' {
		return i + 1, true
	}
	r.vals = make([]uint64, 0, (len(data)-i)/4)
	for {
		switch {
		case isNull(data, i):
			i += len("null")
		case i < len(data) && data[i] == '[':
			i = skipSpace(data, i+1)
			if i < len(data) && data[i] == ']' {
				i++
				break
			}
			for {
				j, v, ok := plainUint(data, i)
				if !ok {
					return i, false
				}
				r.vals = append(r.vals, v)
				i = skipSpace(data, j)
				if i >= len(data) {
					return i, false
				}
				if data[i] == ']' {
					i++
					break
				}
				if data[i] != ',' {
					return i, false
				}
				i = skipSpace(data, i+1)
			}
		default:
			return i, false
		}
		r.ends = append(r.ends, len(r.vals))
		i = skipSpace(data, i)
		if i >= len(data) {
			return i, false
		}
		if data[i] == ']' {
			return i + 1, true
		}
		if data[i] != ',' {
			return i, false
		}
		i = skipSpace(data, i+1)
	}
}

func isNull(data []byte, i int) bool {
	return i+len("null") <= len(data) && string(data[i:i+len("null")]) == "null"
}

// plainUint reads the JSON number at data[i] if it is a plain
// non-negative integer that fits 64 bits (JSON allows no leading zero),
// returning the index just past it.
func plainUint(data []byte, i int) (int, uint64, bool) {
	j := i
	var v uint64
	for j < len(data) && data[j] >= '0' && data[j] <= '9' {
		d := uint64(data[j] - '0')
		if v > (1<<64-1-d)/10 {
			return j, 0, false
		}
		v = v*10 + d
		j++
	}
	if j == i || (data[i] == '0' && j > i+1) {
		return j, 0, false
	}
	return j, v, true
}

// uintOf parses one element: plain digits that fit 64 bits, or the error
// parseUint gives.
func uintOf(raw []byte) (uint64, error) {
	if j, v, ok := plainUint(raw, 0); ok && j == len(raw) {
		return v, nil
	}
	return parseUint(raw)
}
