package check

import (
	"fmt"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"strings"
)

// dockerBuild is what the Dockerfile builds.
type dockerBuild struct {
	binaries map[string]string // binary name → package ("./cmd/producer")
	final    map[string]bool   // binaries copied into the final stage
}

var (
	buildOutput = regexp.MustCompile(`-o\s+(\S+)\s+(\./\S+)`)
	fromLine    = regexp.MustCompile(`(?im)^FROM\s`)
)

func parseDockerfile(text string) (dockerBuild, error) {
	b := dockerBuild{binaries: map[string]string{}, final: map[string]bool{}}
	for _, m := range buildOutput.FindAllStringSubmatch(text, -1) {
		b.binaries[path.Base(m[1])] = m[2]
	}
	if len(b.binaries) == 0 {
		return b, fmt.Errorf("Dockerfile: no `go build -o /out/NAME ./PKG` found")
	}
	idx := fromLine.FindAllStringIndex(text, -1)
	if len(idx) < 2 {
		return b, fmt.Errorf("Dockerfile: want a multi-stage build, found %d FROM", len(idx))
	}
	for _, line := range strings.Split(text[idx[len(idx)-1][0]:], "\n") {
		f := strings.Fields(line)
		if len(f) < 3 || !strings.EqualFold(f[0], "COPY") {
			continue
		}
		for _, src := range f[1 : len(f)-1] {
			if !strings.HasPrefix(src, "--") {
				b.final[path.Base(src)] = true
			}
		}
	}
	return b, nil
}

// checkDockerfile: every binary is built from an existing package and
// copied into the final image; cmd/<name> builds binary <name>.
func checkDockerfile(b dockerBuild, root string) []error {
	var errs []error
	for name, pkg := range b.binaries {
		if fi, err := os.Stat(filepath.Join(root, filepath.FromSlash(pkg))); err != nil || !fi.IsDir() {
			errs = append(errs, fmt.Errorf("Dockerfile builds %s from %s, which is not a directory", name, pkg))
		}
		if strings.HasPrefix(pkg, "./cmd/") && path.Base(pkg) != name {
			errs = append(errs, fmt.Errorf("Dockerfile builds %s from %s: binary and cmd/ directory names differ", name, pkg))
		}
		if !b.final[name] {
			errs = append(errs, fmt.Errorf("Dockerfile builds %s but does not copy it into the final stage", name))
		}
	}
	return errs
}

// imageRepo is an image reference without tag or digest.
func imageRepo(image string) string {
	image, _, _ = strings.Cut(image, "@")
	if i := strings.LastIndex(image, ":"); i > strings.LastIndex(image, "/") {
		image = image[:i]
	}
	return image
}

// checkImages: a container that runs an llmq binary (or uses llmq's image)
// uses the image the Dockerfile builds, and its command names a binary the
// Dockerfile builds from an existing cmd/<name>.
func checkImages(cs []container, repo string, b dockerBuild, root string) []error {
	var errs []error
	for _, c := range cs {
		bin := c.binary()
		_, built := b.binaries[bin]
		cmdDir := false
		if bin != "" {
			fi, err := os.Stat(filepath.Join(root, "cmd", bin))
			cmdDir = err == nil && fi.IsDir()
		}
		ours := imageRepo(c.image) == repo
		if !ours && !built && !cmdDir {
			continue // postgres, rabbitmq, …
		}
		switch {
		case !ours:
			errs = append(errs, fmt.Errorf("%s: runs llmq binary %q from image %q, not %s", c.where, bin, c.image, repo))
		case len(c.command) == 0:
			errs = append(errs, fmt.Errorf("%s: image %s needs a command naming its binary", c.where, c.image))
		case !built:
			errs = append(errs, fmt.Errorf("%s: command %q names no binary the Dockerfile builds", c.where, c.command[0]))
		case !cmdDir && strings.HasPrefix(b.binaries[bin], "./cmd/"):
			errs = append(errs, fmt.Errorf("%s: command %q has no cmd/%s directory", c.where, c.command[0], bin))
		case !strings.HasPrefix(b.binaries[bin], "./cmd/"):
			errs = append(errs, fmt.Errorf("%s: command %q is a helper (%s), not a cmd/ binary", c.where, c.command[0], b.binaries[bin]))
		}
	}
	return errs
}
