package worker

import (
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/require"
)

func TestCallersKeepAGoroutineForTheNextCall(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := newCallers(time.Second)
		done := make(chan struct{})
		c.run(func() { done <- struct{}{} })
		<-done
		synctest.Wait() // its goroutine waits for the next call
		c.run(func() { done <- struct{}{} })
		<-done
		require.EqualValues(t, 1, c.started.Load(), "the second call ran on the first one's goroutine")

		synctest.Wait()
		release := make(chan struct{})
		c.run(func() { <-release })
		c.run(func() { <-release })
		require.EqualValues(t, 2, c.started.Load(), "a call while every goroutine is busy starts one more")
		close(release)

		synctest.Wait()
		time.Sleep(2 * time.Second) // both wait longer than idle and end
		synctest.Wait()
		c.run(func() { done <- struct{}{} })
		<-done
		require.EqualValues(t, 3, c.started.Load(), "a goroutine idle past its time is gone")
		c.close() // the bubble ends only if this one ends too
	})
}
