package client

import (
	"context"
	"fmt"
	"sync"
)

// lifecycle is the Run and Close bookkeeping that Worker, Router and
// HotKeys share. Run may be called once. Close before Run makes Run return
// ErrClosed; Close after Run started cancels Run's context and waits until
// Run returned.
type lifecycle struct {
	name string        // the type, for errors: "Router"
	done chan struct{} // closed when Run returned, or by Close if Run never started

	mu      sync.Mutex
	started bool
	closed  bool
	cancel  context.CancelFunc // cancels Run's context
}

func newLifecycle(name string) *lifecycle {
	return &lifecycle{name: name, done: make(chan struct{})}
}

// begin starts Run. It returns Run's context (ctx, also cancelled by Close
// and by the Client's Close) and end, which Run must call once every
// goroutine it started has exited. It returns ErrClosed after Close, or an
// error wrapping ErrInvalid if Run was called before.
func (l *lifecycle) begin(ctx context.Context, c *Client) (context.Context, func(), error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	switch {
	case l.closed:
		return nil, nil, ErrClosed
	case l.started:
		return nil, nil, fmt.Errorf("%w: %s.Run called twice", ErrInvalid, l.name)
	case c.closed():
		return nil, nil, ErrClosed
	}
	l.started = true
	ctx, cancel := context.WithCancel(ctx)
	l.cancel = cancel
	stopWithClient := context.AfterFunc(c.ctx, cancel)
	end := func() {
		stopWithClient()
		cancel()
		close(l.done)
	}
	return ctx, end, nil
}

// close marks the type closed and reports whether Run had started. If it
// had not, it never will, and done is closed now. It is idempotent.
func (l *lifecycle) close() (started bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if !l.closed && !l.started {
		close(l.done)
	}
	l.closed = true
	return l.started
}

// stop cancels Run's context and waits until Run returned. Call it after
// close.
func (l *lifecycle) stop() {
	l.mu.Lock()
	cancel := l.cancel
	l.mu.Unlock()
	if cancel != nil {
		cancel()
	}
	<-l.done
}

func (l *lifecycle) isClosed() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.closed
}

// result is what Run returns when its work ended with err (nil if it
// stopped because its context ended): parent's error if parent ended, nil
// after Close, ErrClosed after the Client's Close, and err otherwise.
func (l *lifecycle) result(parent context.Context, c *Client, err error) error {
	switch {
	case parent.Err() != nil:
		return parent.Err()
	case l.isClosed():
		return nil
	case c.closed():
		return ErrClosed
	}
	return err
}
