package cpustat

import (
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestParseStatCountsFieldsFromTheLastParenthesis(t *testing.T) {
	// A comm may hold spaces and parentheses; utime and stime are the 14th
	// and 15th fields of the line, the 12th and 13th after the comm.
	line := []byte("4242 (we (ird) name) S 1 4242 4242 0 -1 4194560 100 0 0 0 250 75 0 0 20 0 1 0 99 1000 50\n")
	p, ok := parseStat(line)
	require.True(t, ok)
	require.Equal(t, "we (ird) name", p.comm)
	require.EqualValues(t, 325, p.ticks)

	p, ok = parseStat([]byte("7 (kworker/1:1H-kblockd) I 2 0 0 0 -1 69238880 0 0 0 0 3 4 0 0 0 -20 1 0 20 0 0\n"))
	require.True(t, ok)
	require.Equal(t, "kworker", p.comm, "kernel workers count as one command")
	require.EqualValues(t, 7, p.ticks)

	_, ok = parseStat([]byte("1 (short) S 1 2 3"))
	require.False(t, ok, "a line without utime and stime is refused")
}

func TestWatchCountsAProcessThatExitsInsideTheWindow(t *testing.T) {
	if _, err := os.Stat("/proc/self/stat"); err != nil {
		t.Skip("machine-wide CPU is read from Linux's /proc")
	}
	sh, err := exec.LookPath("sh")
	require.NoError(t, err)
	// A copy of sh under a name of its own, so its row is this test's.
	burner := filepath.Join(t.TempDir(), "cpustatburner")
	require.NoError(t, os.Symlink(sh, burner))

	w, err := NewWatch()
	require.NoError(t, err)
	cmd := exec.Command(burner, "-c", "i=0; while [ $i -lt 400000 ]; do i=$((i+1)); done")
	require.NoError(t, cmd.Start())
	for !w.Alive("cpustatburner") {
		require.NoError(t, w.Sample())
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	for exited := false; !exited; {
		select {
		case err := <-done:
			require.NoError(t, err)
			exited = true
		case <-time.After(20 * time.Millisecond):
			require.NoError(t, w.Sample())
		}
	}
	require.NoError(t, w.Sample())
	require.False(t, w.Alive("cpustatburner"))

	var burned time.Duration
	for _, s := range w.ByCommand() {
		if s.Command == "cpustatburner" {
			burned = s.CPU
		}
	}
	require.Positive(t, burned, "the exited process keeps the CPU its last sample saw")
	require.GreaterOrEqual(t, w.Busy(), burned)
}
