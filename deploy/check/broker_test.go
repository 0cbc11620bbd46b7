package check

import (
	"bytes"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"regexp"
	"slices"
	"strings"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/llmq/llmq/internal/broker"
	"github.com/llmq/llmq/internal/job"
)

// rabbitDefinitions is the part of a RabbitMQ definitions file the checks
// read: users and their permissions.
type rabbitDefinitions struct {
	Users []struct {
		Name             string   `json:"name"`
		PasswordHash     string   `json:"password_hash"`
		HashingAlgorithm string   `json:"hashing_algorithm"`
		Tags             []string `json:"tags"`
	} `json:"users"`
	Permissions []struct {
		User      string `json:"user"`
		Vhost     string `json:"vhost"`
		Configure string `json:"configure"`
		Write     string `json:"write"`
		Read      string `json:"read"`
	} `json:"permissions"`
}

// brokerDefs are the compose RabbitMQ's definitions: the file that a
// conf.d file mounted into it loads (load_definitions).
func brokerDefs(rabbit container) (rabbitDefinitions, error) {
	var defs rabbitDefinitions
	var path string
	for dst, content := range rabbit.files {
		if !strings.HasPrefix(dst, "/etc/rabbitmq/conf.d/") {
			continue
		}
		for line := range strings.Lines(content) {
			if k, v, ok := strings.Cut(line, "="); ok && strings.TrimSpace(k) == "load_definitions" {
				path = strings.TrimSpace(v)
			}
		}
	}
	if path == "" {
		return defs, fmt.Errorf("%s: no conf.d file sets load_definitions: the broker's users are not the deploy files'", rabbit.where)
	}
	content, ok := rabbit.files[path]
	if !ok {
		return defs, fmt.Errorf("%s: load_definitions %s is not a file mounted into the container", rabbit.where, path)
	}
	dec := json.NewDecoder(strings.NewReader(content))
	if err := dec.Decode(&defs); err != nil {
		return defs, fmt.Errorf("%s: %s: %w", rabbit.where, path, err)
	}
	return defs, nil
}

// llmqNames are the exchanges and queues of llmq's topology on a vhost
// (without the test prefix): what a publish-only user may reach only at
// the intake exchange.
func llmqNames() []string {
	names := []string{broker.JobsExchange, broker.LanesExchange, broker.DeadLetterName, broker.StatusName,
		broker.ResultsName, "llmq.dlx", "llmq.delay", "llmq.delay.5s", "llmq.retry", "llmq.reply.demo.q"}
	for _, p := range job.Priorities {
		names = append(names, broker.JobsTopicPrefix+string(p), broker.LanePrefix+string(p))
	}
	return names
}

// checkBrokerUsers holds the RabbitMQ users to the llmq containers and
// their configuration:
//   - every llmq container's LLMQ_AMQP_URL names a user of the definitions
//     whose password hash matches, with configure, write and read ".*" on
//     the URL's vhost (the consumer declares the topology, reads the intake
//     and the lanes; the producer API publishes to lanes and intake);
//   - every tenants.<t>.broker_users user exists, is none of those, has no
//     impersonator tag (which lets a user publish any user_id) and may
//     write the intake exchange llmq.jobs and no other llmq name, configure
//     nothing and read nothing.
func checkBrokerUsers(defs rabbitDefinitions, llmq []container, secrets map[string]map[string]string) []error {
	var errs []error
	users := map[string]int{}
	for i, u := range defs.Users {
		users[u.Name] = i
	}
	perms := func(user, vhost string) (c, w, r string, ok bool) {
		for _, p := range defs.Permissions {
			if p.User == user && p.Vhost == vhost {
				return p.Configure, p.Write, p.Read, true
			}
		}
		return "", "", "", false
	}
	components := map[string]bool{}
	publishers := map[string]string{} // user → where it is configured
	for _, c := range llmq {
		cfg, err := containerConfig(c, secrets)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		for _, t := range cfg.Tenants {
			for _, u := range t.BrokerUsers {
				publishers[u] = c.where
			}
		}
		if cfg.Broker != "" && cfg.Broker != "rabbitmq" && c.env["LLMQ_AMQP_URL"] == "" {
			continue
		}
		uri, err := amqp.ParseURI(cfg.AMQPURL.Reveal())
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: LLMQ_AMQP_URL: %v", c.where, err))
			continue
		}
		components[uri.Username] = true
		i, ok := users[uri.Username]
		if !ok {
			errs = append(errs, fmt.Errorf("%s: RabbitMQ user %q of LLMQ_AMQP_URL is not in the definitions", c.where, uri.Username))
			continue
		}
		if !passwordMatches(defs.Users[i].PasswordHash, uri.Password) {
			errs = append(errs, fmt.Errorf("%s: the password of LLMQ_AMQP_URL does not match user %q's hash", c.where, uri.Username))
		}
		if cf, w, r, ok := perms(uri.Username, uri.Vhost); !ok || cf != ".*" || w != ".*" || r != ".*" {
			errs = append(errs, fmt.Errorf("%s: RabbitMQ user %q needs configure, write and read .* on vhost %q, has %q %q %q",
				c.where, uri.Username, uri.Vhost, cf, w, r))
		}
	}
	names := make([]string, 0, len(publishers))
	for u := range publishers {
		names = append(names, u)
	}
	slices.Sort(names)
	for _, u := range names {
		where := publishers[u]
		i, ok := users[u]
		switch {
		case !ok:
			errs = append(errs, fmt.Errorf("%s: broker user %q is not a RabbitMQ user of the definitions", where, u))
			continue
		case components[u]:
			errs = append(errs, fmt.Errorf("%s: broker user %q is llmq's own user: publishers need credentials of their own", where, u))
			continue
		case slices.Contains(defs.Users[i].Tags, "impersonator"), slices.Contains(defs.Users[i].Tags, "administrator"):
			errs = append(errs, fmt.Errorf("%s: broker user %q has tags %v: it could forge user_id or grant itself more", where, u, defs.Users[i].Tags))
		}
		found := false
		for _, p := range defs.Permissions {
			if p.User != u {
				continue
			}
			found = true
			errs = append(errs, publishOnly(u, p.Vhost, p.Configure, p.Write, p.Read)...)
		}
		if !found {
			errs = append(errs, fmt.Errorf("%s: broker user %q has no permissions: it cannot publish", where, u))
		}
	}
	return errs
}

// publishOnly checks one permission entry of a publisher.
func publishOnly(user, vhost, configure, write, read string) []error {
	var errs []error
	compile := func(kind, expr string) *regexp.Regexp {
		re, err := regexp.Compile(expr)
		if err != nil {
			errs = append(errs, fmt.Errorf("user %q vhost %q: %s %q: %v", user, vhost, kind, expr, err))
		}
		return re
	}
	cRe, wRe, rRe := compile("configure", configure), compile("write", write), compile("read", read)
	if cRe == nil || wRe == nil || rRe == nil {
		return errs
	}
	if !wRe.MatchString(broker.JobsExchange) {
		errs = append(errs, fmt.Errorf("user %q vhost %q: write %q does not let it publish to %s", user, vhost, write, broker.JobsExchange))
	}
	for _, n := range llmqNames() {
		if cRe.MatchString(n) {
			errs = append(errs, fmt.Errorf("user %q vhost %q: configure %q reaches %s: a publisher configures nothing", user, vhost, configure, n))
		}
		if rRe.MatchString(n) {
			errs = append(errs, fmt.Errorf("user %q vhost %q: read %q reaches %s: a publisher reads nothing", user, vhost, read, n))
		}
		if n != broker.JobsExchange && wRe.MatchString(n) {
			errs = append(errs, fmt.Errorf("user %q vhost %q: write %q reaches %s: a publisher writes only %s", user, vhost, write, n, broker.JobsExchange))
		}
	}
	return errs
}

// passwordMatches reports whether password has RabbitMQ's salted SHA-256
// hash: base64(salt[4] + sha256(salt + password)).
func passwordMatches(hash, password string) bool {
	raw, err := base64.StdEncoding.DecodeString(hash)
	if err != nil || len(raw) != 4+sha256.Size {
		return false
	}
	sum := sha256.Sum256(append(append([]byte{}, raw[:4]...), password...))
	return bytes.Equal(sum[:], raw[4:])
}

// amqpContainers are the llmq containers that connect to RabbitMQ.
func amqpContainers(cs []container) []container {
	var out []container
	for _, c := range cs {
		switch c.binary() {
		case "producer", "consumer":
			out = append(out, c)
		}
	}
	return out
}
