package server

// Orphans: kept buffers left unsealed by a creator whose connection ended
// (nobody can seal them any more), removed after Config.OrphanGrace.

import "time"

// orphan marks a (kept, unsealed, its creator gone) for removal after the
// grace period, or removes it now. Called with p.mu held.
func (p *Pool) orphan(a *allocation) {
	a.orphan = true
	a.creator = nil
	p.orphans++
	if p.cfg.OrphanGrace < 0 {
		p.removeOrphan(a)
		return
	}
	p.logf("gpupool: %q: its creator (pid %d) ended before sealing it; removing it in %v", a.name, a.ownerPID, p.cfg.OrphanGrace)
	a.reap = time.AfterFunc(p.cfg.OrphanGrace, func() {
		p.mu.Lock()
		defer p.mu.Unlock()
		if a.orphan && !p.closed {
			p.removeOrphan(a)
		}
	})
}

// unorphan takes a off the orphans (it is being removed another way).
// Called with p.mu held.
func (p *Pool) unorphan(a *allocation) {
	if !a.orphan {
		return
	}
	a.orphan = false
	p.orphans--
	if a.reap != nil {
		a.reap.Stop()
		a.reap = nil
	}
}

// removeOrphan removes an orphan as rm would: its name is unbound (opens
// waiting on it get pool.ErrNoSuchName) and its memory returns. Called
// with p.mu held.
func (p *Pool) removeOrphan(a *allocation) {
	p.unorphan(a)
	p.logf("gpupool: %q: removed (left unsealed by its creator, pid %d)", a.name, a.ownerPID)
	if a.bound && p.names[a.name] == a {
		delete(p.names, a.name)
		p.notify()
	}
	a.bound = false
	a.kept = false
	p.release(a)
}
