package server

import (
	"fmt"
	"io"
	"strconv"

	"gpukit/libgpu/pool"
)

// WriteMetrics writes s in the Prometheus text exposition format (version
// 0.0.4, https://prometheus.io/docs/instrumenting/exposition_formats/):
// one gauge per counter of pool.Stats, labelled with the backend.
func WriteMetrics(w io.Writer, s pool.Stats) error {
	gauges := []struct {
		name, help string
		v          float64
	}{
		{"gpupool_reserved_bytes", "Bytes held in slabs.", float64(s.Reserved)},
		{"gpupool_used_bytes", "Bytes allocated (aligned lengths).", float64(s.Used)},
		{"gpupool_free_bytes", "Bytes reserved and not allocated.", float64(s.Free)},
		{"gpupool_peak_used_bytes", "Highest used bytes seen.", float64(s.Peak)},
		{"gpupool_limit_bytes", "Most bytes the slabs may reserve (0: no limit).", float64(s.Limit)},
		{"gpupool_slabs", "Slabs held.", float64(s.Slabs)},
		{"gpupool_clients", "Open connections.", float64(s.Clients)},
		{"gpupool_allocations", "Live allocations.", float64(s.Allocations)},
		{"gpupool_named_buffers", "Bound buffer names.", float64(s.Named)},
		{"gpupool_fragmentation_ratio", "Share of free bytes in shared slabs outside each slab's largest free range.", s.Fragmentation},
		{"gpupool_waiting_opens", "Opens waiting for a buffer to be sealed.", float64(s.Waiting)},
		{"gpupool_orphan_buffers", "Kept buffers left unsealed by a creator that is gone, awaiting removal.", float64(s.Orphans)},
		{"gpupool_fd_limit", "The daemon's open file descriptor limit.", float64(s.FDLimit)},
		{"gpupool_max_connections", "The most connections served at once.", float64(s.MaxConns)},
	}
	for _, g := range gauges {
		if _, err := fmt.Fprintf(w, "# HELP %s %s\n# TYPE %s gauge\n%s{backend=%q} %s\n", g.name, g.help, g.name, g.name, s.Backend, strconv.FormatFloat(g.v, 'f', -1, 64)); err != nil {
			return err
		}
	}
	return nil
}
