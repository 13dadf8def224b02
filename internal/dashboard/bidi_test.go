package dashboard_test

// A small WebDriver BiDi client: the commands the Firefox tests send
// (https://w3c.github.io/webdriver-bidi/), over one WebSocket. Every
// command carries an id; the answer with that id is its result or its
// error. Events go to onEvent, if set, in the order they come.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"sync"

	"github.com/gorilla/websocket"
)

type bidi struct {
	conn    *websocket.Conn
	wmu     sync.Mutex                                  // one writer at a time on the socket
	onEvent func(method string, params json.RawMessage) // called by the reader; may be nil

	mu      sync.Mutex
	next    int64
	pending map[int64]chan bidiMessage
	done    chan struct{} // closed when the reader stops
	err     error         // why it stopped; set before done is closed
}

// bidiMessage is a command's answer (type success or error) or an event.
type bidiMessage struct {
	Type    string          `json:"type"`
	ID      *int64          `json:"id"`
	Method  string          `json:"method"`
	Params  json.RawMessage `json:"params"`
	Result  json.RawMessage `json:"result"`
	Error   string          `json:"error"`
	Message string          `json:"message"`
}

// bidiError is an error answer: its code (e.g. "no such frame") and message.
type bidiError struct{ Method, Code, Message string }

func (e *bidiError) Error() string { return fmt.Sprintf("%s: %s: %s", e.Method, e.Code, e.Message) }

// dialBiDi connects to url; onEvent (if not nil) gets the events of the
// session.subscribe calls, on the reader's goroutine.
func dialBiDi(ctx context.Context, url string, onEvent func(method string, params json.RawMessage)) (*bidi, error) {
	conn, _, err := websocket.DefaultDialer.DialContext(ctx, url, nil)
	if err != nil {
		return nil, err
	}
	conn.SetReadLimit(64 << 20) // full-page screenshots, base64
	b := &bidi{conn: conn, onEvent: onEvent, pending: map[int64]chan bidiMessage{}, done: make(chan struct{})}
	go b.read() // ends when the socket closes
	return b, nil
}

func (b *bidi) read() {
	var err error
	for {
		var m bidiMessage
		if err = b.conn.ReadJSON(&m); err != nil {
			break
		}
		if m.ID == nil { // an event, or an error without a command's id
			if m.Type == "event" && b.onEvent != nil {
				b.onEvent(m.Method, m.Params)
			}
			continue
		}
		b.mu.Lock()
		ch := b.pending[*m.ID]
		delete(b.pending, *m.ID)
		b.mu.Unlock()
		if ch != nil {
			ch <- m // buffered: the sender may have given up
		}
	}
	b.mu.Lock()
	b.err = err
	b.mu.Unlock()
	close(b.done)
}

// send sends one command and returns its result, or its error answer, or
// ctx's error, or the socket's.
func (b *bidi) send(ctx context.Context, method string, params any) (json.RawMessage, error) {
	if params == nil {
		params = struct{}{}
	}
	ch := make(chan bidiMessage, 1)
	b.mu.Lock()
	b.next++
	id := b.next
	b.pending[id] = ch
	b.mu.Unlock()
	forget := func() {
		b.mu.Lock()
		delete(b.pending, id)
		b.mu.Unlock()
	}
	b.wmu.Lock()
	if d, ok := ctx.Deadline(); ok {
		b.conn.SetWriteDeadline(d)
	}
	err := b.conn.WriteJSON(map[string]any{"id": id, "method": method, "params": params})
	b.wmu.Unlock()
	if err != nil {
		forget()
		return nil, fmt.Errorf("%s: %w", method, err)
	}
	select {
	case m := <-ch:
		if m.Type == "error" {
			return nil, &bidiError{Method: method, Code: m.Error, Message: m.Message}
		}
		return m.Result, nil
	case <-ctx.Done():
		forget()
		return nil, fmt.Errorf("%s: %w", method, ctx.Err())
	case <-b.done:
		return nil, fmt.Errorf("%s: the connection closed: %v", method, b.err)
	}
}

// call is send with the result decoded into out (unless out is nil).
func (b *bidi) call(ctx context.Context, method string, params, out any) error {
	res, err := b.send(ctx, method, params)
	if err != nil || out == nil {
		return err
	}
	if err := json.Unmarshal(res, out); err != nil {
		return fmt.Errorf("%s: decode the result: %w", method, err)
	}
	return nil
}

func (b *bidi) close() {
	b.conn.Close()
	<-b.done
}

// ---- script.evaluate's values ----

// remoteValue is a script result as BiDi serializes it: a type, and a
// value whose shape depends on it; a DOM node has a sharedId, by which
// commands (input.performActions) refer to it.
type remoteValue struct {
	Type     string          `json:"type"`
	Value    json.RawMessage `json:"value"`
	SharedID string          `json:"sharedId"`
}

// plain turns a remote value into the value json.Unmarshal would make of
// its JSON (numbers as json.Number), so it decodes into any Go type.
func (v remoteValue) plain() (any, error) {
	switch v.Type {
	case "undefined", "null":
		return nil, nil
	case "string", "boolean", "date", "regexp":
		var x any
		err := json.Unmarshal(v.Value, &x)
		return x, err
	case "number":
		var special string
		if json.Unmarshal(v.Value, &special) == nil { // NaN, -0, Infinity, -Infinity
			if special == "-0" {
				return json.Number("0"), nil
			}
			return nil, fmt.Errorf("the number %s has no JSON form", special)
		}
		var n json.Number
		err := json.Unmarshal(v.Value, &n)
		return n, err
	case "bigint":
		var s string
		err := json.Unmarshal(v.Value, &s)
		return json.Number(s), err
	case "array", "set":
		var items []remoteValue
		if err := json.Unmarshal(v.Value, &items); err != nil {
			return nil, err
		}
		out := make([]any, len(items))
		for i, it := range items {
			x, err := it.plain()
			if err != nil {
				return nil, err
			}
			out[i] = x
		}
		return out, nil
	case "object", "map":
		var pairs [][2]json.RawMessage
		if err := json.Unmarshal(v.Value, &pairs); err != nil {
			return nil, err
		}
		out := make(map[string]any, len(pairs))
		for _, kv := range pairs {
			var key string
			if json.Unmarshal(kv[0], &key) != nil { // a map's key may be any value
				var k remoteValue
				if err := json.Unmarshal(kv[0], &k); err != nil {
					return nil, err
				}
				kx, err := k.plain()
				if err != nil {
					return nil, err
				}
				key = fmt.Sprint(kx)
			}
			var val remoteValue
			if err := json.Unmarshal(kv[1], &val); err != nil {
				return nil, err
			}
			x, err := val.plain()
			if err != nil {
				return nil, err
			}
			out[key] = x
		}
		return out, nil
	}
	return nil, fmt.Errorf("a %s has no JSON form", v.Type)
}

// decode decodes a remote value into out, through its JSON form.
func (v remoteValue) decode(out any) error {
	x, err := v.plain()
	if err != nil {
		return err
	}
	b, err := json.Marshal(x)
	if err != nil {
		return err
	}
	return json.Unmarshal(b, out)
}

// evaluate runs script.evaluate on the browsing context: a promise is
// awaited, and nothing is kept alive for the result (ownership none). A
// thrown exception is an error.
func (b *bidi) evaluate(ctx context.Context, browsingContext, expr string) (remoteValue, error) {
	var res struct {
		Type             string      `json:"type"` // success or exception
		Result           remoteValue `json:"result"`
		ExceptionDetails struct {
			Text string `json:"text"`
		} `json:"exceptionDetails"`
	}
	err := b.call(ctx, "script.evaluate", map[string]any{
		"expression":      expr,
		"target":          map[string]any{"context": browsingContext},
		"awaitPromise":    true,
		"resultOwnership": "none",
	}, &res)
	if err != nil {
		return remoteValue{}, err
	}
	if res.Type == "exception" {
		return remoteValue{}, errors.New("script.evaluate: exception: " + res.ExceptionDetails.Text)
	}
	return res.Result, nil
}

// ---- input.performActions ----

// pointerAt is a move of the mouse to (x, y) in CSS pixels: from the
// viewport's top left, or from the centre of the element sharedID.
func pointerAt(sharedID string, x, y float64) map[string]any {
	a := map[string]any{"type": "pointerMove", "x": math.Round(x), "y": math.Round(y), "duration": 0}
	if sharedID != "" {
		a["origin"] = map[string]any{"type": "element", "element": map[string]any{"sharedId": sharedID}}
	}
	return a
}

func mouseActions(actions ...map[string]any) map[string]any {
	return map[string]any{"type": "pointer", "id": "mouse", "parameters": map[string]any{"pointerType": "mouse"}, "actions": actions}
}

func keyActions(text string) map[string]any {
	var actions []map[string]any
	for _, r := range text {
		actions = append(actions, map[string]any{"type": "keyDown", "value": string(r)}, map[string]any{"type": "keyUp", "value": string(r)})
	}
	return map[string]any{"type": "key", "id": "keyboard", "actions": actions}
}
