package stream

import (
	"context"
	"errors"
	"sync"

	"github.com/keyshard/keyshard/client"
)

// runner is the Run and Close of Waker and Consumer: Run may be called
// once and returns client.ErrClosed after Close; Close is idempotent,
// may come before Run, and waits until Run has returned.
type runner struct {
	mu      sync.Mutex
	started bool
	closed  bool
	cancel  context.CancelFunc
	done    chan struct{} // closed when Run returns; made by the first of Run and Close
}

func (r *runner) doneLocked() chan struct{} {
	if r.done == nil {
		r.done = make(chan struct{})
	}
	return r.done
}

// run calls loop with a ctx that Close cancels, on the caller's
// goroutine. name is the type, for the error of a second call.
func (r *runner) run(ctx context.Context, name string, loop func(context.Context) error) error {
	r.mu.Lock()
	if r.started {
		r.mu.Unlock()
		return errors.New("stream: " + name + ".Run called twice")
	}
	r.started = true
	done := r.doneLocked()
	defer close(done)
	if r.closed {
		r.mu.Unlock()
		return client.ErrClosed
	}
	ctx, r.cancel = context.WithCancel(ctx)
	r.mu.Unlock()
	err := loop(ctx)
	r.mu.Lock()
	defer r.mu.Unlock()
	r.cancel()
	if r.closed {
		return client.ErrClosed
	}
	return err
}

func (r *runner) close() {
	r.mu.Lock()
	r.closed = true
	done := r.doneLocked()
	started := r.started
	if r.cancel != nil {
		r.cancel()
	}
	r.mu.Unlock()
	if started {
		<-done
	}
}
