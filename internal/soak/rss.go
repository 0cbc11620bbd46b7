package soak

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"strconv"
	"strings"
)

// Memory is a process's resident memory in kB: RSS in all, and Anon, the
// part that is not file-backed (heap, stacks). The rest, RssFile, is
// mostly the binary's own pages, faulted in as code paths first run (a
// reconnect, an error path), so RSS can grow without a leak; Anon tells.
type Memory struct{ RSS, Anon int64 }

// ReadMemory reads pid's /proc/<pid>/status.
func ReadMemory(pid int) (Memory, error) {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return Memory{}, err
	}
	return parseStatus(data)
}

// parseStatus finds the "VmRSS:   12345 kB" and "RssAnon: … kB" lines of
// a /proc status file (RssAnon since Linux 4.5; 0 when absent).
func parseStatus(status []byte) (Memory, error) {
	var m Memory
	found := false
	sc := bufio.NewScanner(bytes.NewReader(status))
	for sc.Scan() {
		key, rest, ok := strings.Cut(sc.Text(), ":")
		if !ok || (key != "VmRSS" && key != "RssAnon") {
			continue
		}
		f := strings.Fields(rest)
		if len(f) != 2 || f[1] != "kB" {
			return m, fmt.Errorf("unexpected %s line %q", key, sc.Text())
		}
		kb, err := strconv.ParseInt(f[0], 10, 64)
		if err != nil {
			return m, err
		}
		if key == "VmRSS" {
			m.RSS, found = kb, true
		} else {
			m.Anon = kb
		}
	}
	if !found {
		return m, fmt.Errorf("no VmRSS line (a kernel thread or a zombie)")
	}
	return m, nil
}
