package check

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
)

// checkSecurity: Kubernetes containers run as non-root on a read-only root
// filesystem with no capabilities, no privilege escalation and the
// runtime's seccomp profile.
func checkSecurity(cs []container) []error {
	var errs []error
	for _, c := range cs {
		if !c.k8s {
			continue
		}
		s := c.security
		want := func(ok bool, what string) {
			if !ok {
				errs = append(errs, fmt.Errorf("%s: securityContext needs %s", c.where, what))
			}
		}
		want(s["runAsNonRoot"] == true, "runAsNonRoot: true")
		want(s["readOnlyRootFilesystem"] == true, "readOnlyRootFilesystem: true")
		want(s["allowPrivilegeEscalation"] == false, "allowPrivilegeEscalation: false")
		want(slices.Contains(strs(get(s, "capabilities", "drop")), "ALL"), "capabilities.drop: [ALL]")
		want(str(get(s, "seccompProfile", "type")) == "RuntimeDefault", "seccompProfile.type: RuntimeDefault")
	}
	return errs
}

// checkKustomization: resources exist, and the image override names the
// image the Dockerfile builds.
func checkKustomization(k doc, dir, repo string) []error {
	var errs []error
	for _, r := range strs(k["resources"]) {
		if _, err := os.Stat(filepath.Join(dir, filepath.FromSlash(r))); err != nil {
			errs = append(errs, fmt.Errorf("kustomization: resource %s: %w", r, err))
		}
	}
	for _, img := range list(k["images"]) {
		if n := str(get(img, "name")); n != repo {
			errs = append(errs, fmt.Errorf("kustomization: image override %s, but the Dockerfile's image is %s", n, repo))
		}
	}
	return errs
}
