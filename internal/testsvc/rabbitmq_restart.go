package testsvc

import (
	"context"
	"fmt"
	"os/exec"
	"strings"
)

// StartRabbitMQApp starts the local RabbitMQ application again after a test
// stopped it (rabbitmqctl stop_app), waits until it has booted, and makes
// sure the supervisor of the quorum queues' dead-letter workers runs. It
// reports whether that supervisor had to be started.
//
// RabbitMQ 3.10 allows that supervisor one restart in five seconds. A start
// that recovers queues whose dead-letter workers crash (queues of vhosts
// deleted just before the stop are enough) can leave it stopped, and from
// then on every quorum queue with at-least-once dead-lettering, which llmq
// declares, crashes as soon as it elects a leader: declares answer
// INTERNAL_ERROR and publishes are refused, for every later test on the
// machine, until the broker itself restarts (rabbitmq-server issue 16652
// describes the mechanism). The restart tests check the supervisor after
// every start, so that one bad start fails at most the test that made it.
func StartRabbitMQApp(ctx context.Context) (restartedDLX bool, err error) {
	for _, args := range [][]string{{"start_app"}, {"await_startup"}} {
		if err := RabbitMQCtl(ctx, args...); err != nil {
			return false, err
		}
	}
	out, err := rabbitmqctlOutput(ctx, "eval", ensureDLXSupervisor)
	if err != nil {
		return false, err
	}
	switch out {
	case "running":
		return false, nil
	case "restarted", "started":
		return true, nil
	default:
		return false, fmt.Errorf("rabbitmqctl: the quorum queues' dead-letter supervisor is down and did not start: %s", out)
	}
}

// ensureDLXSupervisor starts rabbit_fifo_dlx_sup under rabbit_sup when it
// is not running: restart_child when rabbit_sup still holds its child
// spec, start_child when not.
const ensureDLXSupervisor = `case whereis(rabbit_fifo_dlx_sup) of
	undefined ->
		case supervisor:restart_child(rabbit_sup, rabbit_fifo_dlx_sup) of
			{ok, _} -> restarted;
			{error, not_found} ->
				case rabbit_sup:start_supervisor_child(rabbit_fifo_dlx_sup) of
					ok -> started;
					E -> E
				end;
			E -> E
		end;
	_ -> running
end.`

// RabbitMQCtl runs rabbitmqctl with args; its output is in the error.
func RabbitMQCtl(ctx context.Context, args ...string) error {
	_, err := rabbitmqctlOutput(ctx, args...)
	return err
}

func rabbitmqctlOutput(ctx context.Context, args ...string) (string, error) {
	out, err := exec.CommandContext(ctx, "rabbitmqctl", args...).CombinedOutput()
	if err != nil {
		return "", fmt.Errorf("rabbitmqctl %s: %w: %s", strings.Join(args, " "), err, out)
	}
	return strings.TrimSpace(string(out)), nil
}
