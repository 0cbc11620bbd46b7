// Package batch groups items that arrive close together so that one round
// trip (a statement batch, a publish burst) serves many of them: the
// worker's claims and completions and the ingester's inserts.
package batch

import (
	"sync"
	"time"
)

// Batcher groups items that arrive within wait of each other (up to max)
// and hands each group to flush, running at most parallel flushes at once.
type Batcher[T any] struct {
	in    chan T
	max   int
	wait  time.Duration
	flush func([]T)
	sem   chan struct{}
	wg    sync.WaitGroup // the loop and every running flush
	once  sync.Once
}

// New starts a Batcher; Close stops it.
func New[T any](max int, wait time.Duration, parallel int, flush func([]T)) *Batcher[T] {
	b := &Batcher[T]{in: make(chan T, max), max: max, wait: wait, flush: flush, sem: make(chan struct{}, parallel)}
	b.wg.Add(1)
	go b.loop()
	return b
}

// Add queues an item. Must not be called after Close.
func (b *Batcher[T]) Add(item T) { b.in <- item }

// Close flushes what is queued and waits for every flush to return.
func (b *Batcher[T]) Close() {
	b.once.Do(func() { close(b.in) })
	b.wg.Wait()
}

func (b *Batcher[T]) loop() {
	defer b.wg.Done()
	timer := time.NewTimer(time.Hour)
	timer.Stop()
	for {
		first, ok := <-b.in
		if !ok {
			return
		}
		batch := []T{first}
		open := true
		// Take whatever is already waiting, then wait briefly for more.
		timer.Reset(b.wait)
	collect:
		for len(batch) < b.max {
			select {
			case it, ok := <-b.in:
				if !ok {
					open = false
					break collect
				}
				batch = append(batch, it)
			case <-timer.C:
				break collect
			}
		}
		if !timer.Stop() {
			select {
			case <-timer.C:
			default:
			}
		}
		b.sem <- struct{}{}
		b.wg.Add(1)
		go func() {
			defer func() { <-b.sem; b.wg.Done() }()
			b.flush(batch)
		}()
		if !open {
			return
		}
	}
}
