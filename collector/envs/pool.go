package envs

import (
	"errors"
	"sync"
)

// pool runs a job over copy ranges on persistent goroutines: the caller's
// goroutine takes the first range, workers-1 helpers the others. A job
// costs a channel handoff per helper (waking a parked goroutine: a few
// microseconds), which is why Vector only uses a pool when steps are
// expensive enough to repay it.
type pool struct {
	workers int
	bounds  []int // range w is [bounds[w], bounds[w+1])
	start   []chan func(lo, hi int)
	errs    []error
	wg      sync.WaitGroup // jobs in flight
	exited  sync.WaitGroup // helpers running
}

func newPool(n, workers int) *pool {
	p := &pool{workers: workers, bounds: make([]int, workers+1), start: make([]chan func(lo, hi int), workers), errs: make([]error, workers)}
	for w := 0; w <= workers; w++ {
		p.bounds[w] = w * n / workers
	}
	for w := 1; w < workers; w++ {
		p.start[w] = make(chan func(lo, hi int))
		p.exited.Add(1)
		go p.helper(w)
	}
	return p
}

func (p *pool) helper(w int) {
	defer p.exited.Done()
	for job := range p.start[w] {
		p.errs[w] = guard(job, p.bounds[w], p.bounds[w+1])
		p.wg.Done()
	}
}

func (p *pool) run(job func(lo, hi int)) error {
	p.wg.Add(p.workers - 1)
	for w := 1; w < p.workers; w++ {
		p.start[w] <- job
	}
	p.errs[0] = guard(job, p.bounds[0], p.bounds[1])
	p.wg.Wait()
	return errors.Join(p.errs...)
}

func (p *pool) close() {
	for w := 1; w < p.workers; w++ {
		close(p.start[w])
	}
	p.exited.Wait()
}
