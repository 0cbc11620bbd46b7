package testsvc

import (
	"net/url"
	"os/exec"
	"strings"
	"testing"
)

// AMQPVhost creates a vhost of its own on the RabbitMQ of AMQPURL with
// rabbitmqctl, deleted when the test ends, and returns its URL: for tests
// of what runs under llmq's fixed names on the broker (launch.Consumer,
// the binaries), which AMQPPrefix cannot isolate. It fails the test when
// rabbitmqctl is not next to the broker.
func AMQPVhost(t testing.TB) string {
	t.Helper()
	u, err := url.Parse(AMQPURL(t))
	if err != nil {
		t.Fatalf("%s: %v", EnvAMQPURL, err)
	}
	user := u.User.Username()
	if user == "" {
		user = "guest"
	}
	vhost := strings.TrimSuffix(uniquePrefix(t), ".")
	ctl := func(args ...string) error {
		out, err := exec.Command("rabbitmqctl", args...).CombinedOutput()
		if err != nil {
			t.Logf("rabbitmqctl %s: %v: %s", strings.Join(args, " "), err, out)
		}
		return err
	}
	if ctl("add_vhost", vhost) != nil {
		t.Fatal("a vhost of its own needs rabbitmqctl next to the broker")
	}
	t.Cleanup(func() { _ = ctl("delete_vhost", vhost) })
	if ctl("set_permissions", "-p", vhost, user, ".*", ".*", ".*") != nil {
		t.Fatal("set the vhost's permissions")
	}
	u.Path, u.RawPath = "/"+vhost, ""
	return u.String()
}
