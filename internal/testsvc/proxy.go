package testsvc

import (
	"net"
	"sync/atomic"
	"testing"
	"time"
)

// Proxy forwards TCP to a server until it is wedged; wedged, it holds what
// it reads and answers nothing, as a server behind a partition, a stopped
// VM or a wedged proxy does: the client's kernel sees its bytes accepted,
// so only the client's own deadlines end its wait.
type Proxy struct {
	ln     net.Listener
	wedged atomic.Bool
}

// NewProxy listens on a loopback port and forwards every connection to
// target until the test ends.
func NewProxy(t testing.TB, target string) *Proxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("testsvc: proxy: %v", err)
	}
	p := &Proxy{ln: ln}
	go p.serve(target)
	t.Cleanup(func() { p.wedged.Store(false); ln.Close() })
	return p
}

// Addr is the address clients dial instead of target.
func (p *Proxy) Addr() string { return p.ln.Addr().String() }

// Wedge stops (true) or resumes (false) the forwarding.
func (p *Proxy) Wedge(on bool) { p.wedged.Store(on) }

func (p *Proxy) serve(target string) {
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		s, err := net.Dial("tcp", target)
		if err != nil {
			c.Close()
			continue
		}
		go p.pipe(c, s)
		go p.pipe(s, c)
	}
}

func (p *Proxy) pipe(dst, src net.Conn) {
	defer dst.Close()
	defer src.Close()
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		for p.wedged.Load() {
			time.Sleep(5 * time.Millisecond)
		}
		if n > 0 {
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}
