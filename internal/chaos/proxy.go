package chaos

import (
	"errors"
	"fmt"
	"net"
	"strings"
	"sync"
	"time"
)

// Proxy is a TCP fault proxy on loopback in front of one or more
// backends: each connection goes to the next backend in turn that
// accepts it, so clients spread over the backends and reach a surviving
// one once a backend dies (connections to a dead backend break, as they
// would behind a real load balancer). Its faults:
//
//   - Partition: bytes stop flowing both ways, on open connections and on
//     new ones (which are accepted but not connected onward), until Heal;
//     then the held bytes flow on, as TCP retransmission would deliver
//     them after a short partition;
//   - Reset: every open connection is closed with a TCP RST;
//   - SetDelay: every chunk of bytes, either way, is held for a delay.
//
// Its methods are safe for concurrent use.
type Proxy struct {
	ln       net.Listener
	backends []string
	closed   chan struct{}

	mu      sync.Mutex
	next    int
	conns   map[net.Conn]struct{}
	gate    chan struct{} // closed while bytes may flow; open during a partition
	delay   time.Duration
	stats   ProxyStats
	wg      sync.WaitGroup // the accept loop and every connection's copiers
	stopped bool
}

// ProxyStats counts what a Proxy did: the proof that its faults took
// effect.
type ProxyStats struct {
	// Conns is the number of connections accepted; Open those open now.
	Conns, Open int
	// Held counts chunks (and new connections) held by a partition;
	// Delayed the chunks held by an added delay; Resets the connections
	// closed with an RST.
	Held, Delayed, Resets int
	// Bytes is the number of bytes forwarded.
	Bytes int64
}

// NewProxy starts a proxy listening on addr (such as "127.0.0.1:0") in
// front of backends (host:port). Close stops it.
func NewProxy(addr string, backends ...string) (*Proxy, error) {
	if len(backends) == 0 {
		return nil, errors.New("chaos: a proxy needs at least one backend")
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("chaos: start a proxy: %w", err)
	}
	gate := make(chan struct{})
	close(gate)
	p := &Proxy{ln: ln, backends: backends, conns: map[net.Conn]struct{}{}, gate: gate, closed: make(chan struct{})}
	p.wg.Go(p.accept) // exits when Close closes the listener
	return p, nil
}

// Addr is the proxy's host:port.
func (p *Proxy) Addr() string { return p.ln.Addr().String() }

// URL is the proxy's http:// URL.
func (p *Proxy) URL() string { return "http://" + p.Addr() }

// Close closes the listener and every connection, and waits until every
// goroutine of the proxy has exited. It is idempotent.
func (p *Proxy) Close() {
	p.mu.Lock()
	if p.stopped {
		p.mu.Unlock()
		p.wg.Wait()
		return
	}
	p.stopped = true
	close(p.closed)
	p.ln.Close()
	for c := range p.conns {
		c.Close()
	}
	p.mu.Unlock()
	p.wg.Wait()
}

// Partition stops bytes from flowing until Heal.
func (p *Proxy) Partition() {
	p.mu.Lock()
	defer p.mu.Unlock()
	select {
	case <-p.gate:
		p.gate = make(chan struct{})
	default: // already partitioned
	}
}

// Heal ends a partition.
func (p *Proxy) Heal() {
	p.mu.Lock()
	defer p.mu.Unlock()
	select {
	case <-p.gate:
	default:
		close(p.gate)
	}
}

// SetDelay holds every chunk of bytes, either way, for d (0: none).
func (p *Proxy) SetDelay(d time.Duration) {
	p.mu.Lock()
	p.delay = d
	p.mu.Unlock()
}

// Reset closes every open connection with a TCP RST and returns how many
// it closed.
func (p *Proxy) Reset() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	// Every connection gets linger 0 before any is closed: closing one
	// side ends its copier, which closes the other side itself, and that
	// close must be an RST too.
	for c := range p.conns {
		if tc, ok := c.(*net.TCPConn); ok {
			_ = tc.SetLinger(0)
		}
	}
	n := 0
	for c := range p.conns {
		c.Close()
		delete(p.conns, c)
		n++
	}
	p.stats.Resets += n
	return n
}

// Stats returns the proxy's counters.
func (p *Proxy) Stats() ProxyStats {
	p.mu.Lock()
	defer p.mu.Unlock()
	s := p.stats
	s.Open = len(p.conns)
	return s
}

func (p *Proxy) accept() {
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		p.wg.Go(func() { p.serve(c) }) // exits when either side closes
	}
}

func (p *Proxy) track(c net.Conn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.stopped {
		return false
	}
	p.conns[c] = struct{}{}
	return true
}

func (p *Proxy) untrack(cs ...net.Conn) {
	p.mu.Lock()
	for _, c := range cs {
		delete(p.conns, c)
	}
	p.mu.Unlock()
}

// wait holds a chunk while the proxy is partitioned, then for the added
// delay. It returns false once the proxy is closed.
func (p *Proxy) wait() bool {
	p.mu.Lock()
	gate, delay := p.gate, p.delay
	held := false
	select {
	case <-gate:
	default:
		p.stats.Held++
		held = true
	}
	if delay > 0 {
		p.stats.Delayed++
	}
	p.mu.Unlock()
	if held {
		select {
		case <-gate:
		case <-p.closed:
			return false
		}
	}
	if delay > 0 {
		t := time.NewTimer(delay)
		defer t.Stop()
		select {
		case <-t.C:
		case <-p.closed:
			return false
		}
	}
	return true
}

func (p *Proxy) serve(c net.Conn) {
	defer c.Close()
	if !p.track(c) {
		return
	}
	defer p.untrack(c)
	p.mu.Lock()
	p.stats.Conns++
	start := p.next
	p.next++
	p.mu.Unlock()
	if !p.wait() { // a partition holds new connections too
		return
	}
	var up net.Conn
	for i := range p.backends {
		d, err := net.DialTimeout("tcp", p.backends[(start+i)%len(p.backends)], time.Second)
		if err == nil {
			up = d
			break
		}
	}
	if up == nil {
		return
	}
	defer up.Close()
	if !p.track(up) {
		return
	}
	defer p.untrack(up)
	done := make(chan struct{}, 2)
	go func() { p.copy(up, c); up.Close(); done <- struct{}{} }() // exits when c or up closes
	go func() { p.copy(c, up); c.Close(); done <- struct{}{} }()  // exits when up or c closes
	<-done
	<-done
}

func (p *Proxy) copy(dst, src net.Conn) {
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			if !p.wait() {
				return
			}
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
			p.mu.Lock()
			p.stats.Bytes += int64(n)
			p.mu.Unlock()
		}
		if err != nil {
			return
		}
	}
}

// Proxies are a worker's ways to the replicas, one proxy in front of each,
// so that the worker is given every replica's URL as a user's worker is;
// a fault on the worker's link applies to all of them.
type Proxies []*Proxy

// URL is the proxies' URLs, comma-separated, as client.Dial takes them.
func (ps Proxies) URL() string {
	urls := make([]string, len(ps))
	for i, p := range ps {
		urls[i] = p.URL()
	}
	return strings.Join(urls, ",")
}

// Partition partitions every proxy; Heal heals them.
func (ps Proxies) Partition() {
	for _, p := range ps {
		p.Partition()
	}
}

// Heal ends a partition of every proxy.
func (ps Proxies) Heal() {
	for _, p := range ps {
		p.Heal()
	}
}

// SetDelay sets every proxy's delay.
func (ps Proxies) SetDelay(d time.Duration) {
	for _, p := range ps {
		p.SetDelay(d)
	}
}

// Reset resets every proxy's connections and returns how many it closed.
func (ps Proxies) Reset() int {
	n := 0
	for _, p := range ps {
		n += p.Reset()
	}
	return n
}

// Stats sums the proxies' counters.
func (ps Proxies) Stats() ProxyStats {
	var s ProxyStats
	for _, p := range ps {
		t := p.Stats()
		s.Conns, s.Open, s.Held, s.Delayed, s.Resets, s.Bytes = s.Conns+t.Conns, s.Open+t.Open, s.Held+t.Held, s.Delayed+t.Delayed, s.Resets+t.Resets, s.Bytes+t.Bytes
	}
	return s
}

// Close closes every proxy.
func (ps Proxies) Close() {
	for _, p := range ps {
		p.Close()
	}
}
