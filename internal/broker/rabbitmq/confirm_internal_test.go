package rabbitmq

import (
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"syscall"
	"testing"

	amqp "github.com/rabbitmq/amqp091-go"
)

// A publish whose socket write failed before the connection's reader saw
// the broker go is tried again on a new channel, as one whose channel was
// already closed is: TestBrokerServiceRestart once saw "write: connection
// reset by peer" returned to the caller across a restart.
func TestAPublishLostWithItsConnectionIsTriedAgain(t *testing.T) {
	reset := &net.OpError{Op: "write", Net: "tcp", Err: os.NewSyscallError("write", syscall.ECONNRESET)}
	for _, c := range []struct {
		name   string
		err    error
		closed bool
		want   bool
	}{
		{"connection reset on write", reset, false, true},
		{"wrapped reset", fmt.Errorf("publish: %w", syscall.ECONNRESET), false, true},
		{"broken pipe", fmt.Errorf("publish: %w", syscall.EPIPE), false, true},
		{"end of stream", io.EOF, false, true},
		{"channel closed", amqp.ErrClosed, false, true},
		{"channel seen closed", errors.New("any"), true, true},
		{"anything else, channel open", errors.New("frame too large"), false, false},
	} {
		if got := lostOnTheWay(c.err, c.closed); got != c.want {
			t.Errorf("%s: lostOnTheWay = %v, want %v", c.name, got, c.want)
		}
	}
}
