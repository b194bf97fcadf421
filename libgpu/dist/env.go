package dist

import (
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
)

// ErrEnv: the rank environment is incomplete or contradicts itself.
var ErrEnv = errors.New("dist: bad rank environment")

// World is where this process stands in a job of several processes, one
// per GPU: its rank among all of them and among those on its machine, and
// where rank 0 can be reached. The zero World is not valid; a process
// started alone has Size 1 (Single).
type World struct {
	Rank, Size           int // global rank in [0, Size)
	LocalRank, LocalSize int // rank among the ranks on this machine, and their number
	Node, Nodes          int // this machine's index in [0, Nodes)

	// MasterAddr and MasterPort locate rank 0 (a host name or address and
	// a TCP port); with Size 1 they are "127.0.0.1" and 0.
	MasterAddr string
	MasterPort int
	// RendezvousPort is the TCP port rank 0's Rendezvous listens on:
	// MasterPort, except under torchrun's agent store, whose own TCPStore
	// already holds MasterPort (TORCHELASTIC_USE_AGENT_STORE=True):
	// MasterPort+1 there. GPUKIT_RENDEZVOUS_PORT overrides both.
	RendezvousPort int

	// Source names the convention the values came from: "torchrun"
	// (RANK, WORLD_SIZE, ...: torchrun, trainer launch and compatible
	// launchers), "slurm" (an srun task) or "" (a single process).
	Source string
}

// Single is the world of a process started alone.
func Single() World {
	return World{Size: 1, LocalSize: 1, Nodes: 1, MasterAddr: "127.0.0.1"}
}

// Distributed reports whether there are other ranks.
func (w World) Distributed() bool { return w.Size > 1 }

// IsMain reports whether this is rank 0, the rank that writes checkpoints,
// metrics and plots.
func (w World) IsMain() bool { return w.Rank == 0 }

func (w World) String() string {
	if w.Size <= 1 {
		return "rank 0 of 1"
	}
	return fmt.Sprintf("rank %d of %d (local %d of %d, node %d of %d, rank 0 at %s:%d, from %s)",
		w.Rank, w.Size, w.LocalRank, w.LocalSize, w.Node, w.Nodes, w.MasterAddr, w.MasterPort, w.Source)
}

// DeviceOrdinal is the GPU this rank uses among the visible ones
// (CUDA_VISIBLE_DEVICES applied): LOCAL_RANK, as torchrun's scripts do
// (torch.cuda.set_device(LOCAL_RANK)), so each rank of a machine takes its
// own GPU and every GPU stays visible to NCCL. When exactly one GPU is
// visible it is that one: a scheduler that binds one GPU per task (Slurm's
// --gpus-per-task=1) hides the others. More ranks on a machine than GPUs
// is an error (NCCL refuses two ranks on one GPU).
func (w World) DeviceOrdinal(visible int) (int, error) {
	switch {
	case visible == 1:
		return 0, nil
	case w.LocalRank < visible:
		return w.LocalRank, nil
	}
	return 0, fmt.Errorf("%w: local rank %d needs a GPU of its own, but %d are visible here (more ranks per machine than GPUs?)",
		ErrEnv, w.LocalRank, visible)
}

// Env is the torchrun-style environment that describes w to a child
// process (what trainer launch sets): RANK, LOCAL_RANK, WORLD_SIZE,
// LOCAL_WORLD_SIZE, GROUP_RANK, GROUP_WORLD_SIZE, ROLE_RANK,
// ROLE_WORLD_SIZE, MASTER_ADDR and MASTER_PORT, as NAME=value strings.
func (w World) Env() []string {
	kv := []struct {
		k string
		v any
	}{
		{"RANK", w.Rank}, {"LOCAL_RANK", w.LocalRank}, {"WORLD_SIZE", w.Size}, {"LOCAL_WORLD_SIZE", w.LocalSize},
		{"GROUP_RANK", w.Node}, {"GROUP_WORLD_SIZE", w.Nodes}, {"ROLE_RANK", w.Rank}, {"ROLE_WORLD_SIZE", w.Size},
		{"MASTER_ADDR", w.MasterAddr}, {"MASTER_PORT", w.MasterPort},
	}
	out := make([]string, len(kv))
	for i, e := range kv {
		out[i] = fmt.Sprintf("%s=%v", e.k, e.v)
	}
	return out
}

// EnvRendezvousPort overrides World.RendezvousPort.
const EnvRendezvousPort = "GPUKIT_RENDEZVOUS_PORT"

// FromEnv reads the process's environment (see Parse).
func FromEnv() (World, error) { return Parse(os.LookupEnv) }

// Parse reads the rank environment through lookup (os.LookupEnv), in the
// conventions users already have:
//
//   - torchrun's (and trainer launch's): RANK and WORLD_SIZE, both or
//     neither; LOCAL_RANK and LOCAL_WORLD_SIZE, both or neither (neither:
//     one machine, LOCAL_RANK = RANK); GROUP_RANK and GROUP_WORLD_SIZE for
//     the machine when set (else RANK / LOCAL_WORLD_SIZE, assuming as many
//     ranks on every machine); MASTER_ADDR and MASTER_PORT, required above
//     one rank. These win over Slurm's: torchrun started by srun sees both.
//   - Slurm's, for a task srun started (SLURM_STEP_ID set; a batch script
//     or an salloc shell is one process even though SLURM_PROCID is set):
//     SLURM_PROCID, SLURM_NTASKS (or SLURM_NPROCS), SLURM_LOCALID,
//     SLURM_NODEID, the step's tasks per node (SLURM_STEP_TASKS_PER_NODE,
//     else SLURM_TASKS_PER_NODE, "2(x3),1") for LOCAL_WORLD_SIZE, and the
//     step's node count. Rank 0's address is MASTER_ADDR when set, else the
//     first host of SLURM_STEP_NODELIST (else SLURM_JOB_NODELIST,
//     SLURM_NODELIST), expanded from Slurm's compressed form; the port is
//     MASTER_PORT when set, else 15000 plus the last four digits of
//     SLURM_JOB_ID (PyTorch Lightning's SLURMEnvironment rule, so that jobs
//     sharing a node differ).
//   - neither: Single().
//
// Errors wrap ErrEnv and name the variables: a number that does not parse,
// a rank outside its size, a local size above the world size, one of a
// pair without the other, a missing MASTER_ADDR or MASTER_PORT above one
// rank, a port outside 1..65535, and RANK disagreeing with SLURM_PROCID
// where both describe the same tasks (WORLD_SIZE = SLURM_NTASKS; typically
// a RANK exported to every task).
func Parse(lookup func(string) (string, bool)) (World, error) {
	get := func(k string) (string, bool) {
		v, ok := lookup(k)
		v = strings.TrimSpace(v)
		return v, ok && v != ""
	}
	_, hasRank := get("RANK")
	_, hasSize := get("WORLD_SIZE")
	var w World
	var err error
	switch {
	case hasRank || hasSize:
		w, err = parseTorchrun(get)
	case isSlurmTask(get):
		w, err = parseSlurm(get)
	default:
		w = Single()
	}
	if err != nil {
		return World{}, err
	}
	w.RendezvousPort = w.MasterPort
	if v, ok := get("TORCHELASTIC_USE_AGENT_STORE"); ok && strings.EqualFold(v, "true") && w.Size > 1 {
		w.RendezvousPort = w.MasterPort + 1
	}
	if _, ok := get(EnvRendezvousPort); ok {
		if w.RendezvousPort, err = port(get, EnvRendezvousPort); err != nil {
			return World{}, err
		}
	}
	if w.Size > 1 && w.RendezvousPort > 65535 {
		return World{}, fmt.Errorf("%w: the rendezvous port %d (MASTER_PORT+1 under torchrun's agent store) is out of range; set %s",
			ErrEnv, w.RendezvousPort, EnvRendezvousPort)
	}
	return w, nil
}

type getter func(string) (string, bool)

// integer reads variable k as a decimal integer ≥ min.
func integer(get getter, k string, min int) (int, error) {
	v, ok := get(k)
	if !ok {
		return 0, fmt.Errorf("%w: %s is not set", ErrEnv, k)
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < min {
		return 0, fmt.Errorf("%w: %s=%q: want an integer ≥ %d", ErrEnv, k, v, min)
	}
	return n, nil
}

// pair reads two variables that come together, or neither (ok false).
func pair(get getter, a, b string, minA, minB int) (x, y int, ok bool, err error) {
	_, hasA := get(a)
	_, hasB := get(b)
	if hasA != hasB {
		set, unset := a, b
		if hasB {
			set, unset = b, a
		}
		return 0, 0, false, fmt.Errorf("%w: %s is set but %s is not (set both or neither)", ErrEnv, set, unset)
	}
	if !hasA {
		return 0, 0, false, nil
	}
	if x, err = integer(get, a, minA); err != nil {
		return 0, 0, false, err
	}
	if y, err = integer(get, b, minB); err != nil {
		return 0, 0, false, err
	}
	return x, y, true, nil
}

func port(get getter, k string) (int, error) {
	p, err := integer(get, k, 1)
	if err != nil {
		return 0, err
	}
	if p > 65535 {
		v, _ := get(k)
		return 0, fmt.Errorf("%w: %s=%q: want a TCP port in 1..65535", ErrEnv, k, v)
	}
	return p, nil
}

func parseTorchrun(get getter) (World, error) {
	rank, size, _, err := pair(get, "RANK", "WORLD_SIZE", 0, 1)
	if err != nil {
		return World{}, err
	}
	if rank >= size {
		return World{}, fmt.Errorf("%w: RANK=%d is not below WORLD_SIZE=%d", ErrEnv, rank, size)
	}
	w := World{Rank: rank, Size: size, LocalRank: rank, LocalSize: size, Source: "torchrun"}
	lr, ls, ok, err := pair(get, "LOCAL_RANK", "LOCAL_WORLD_SIZE", 0, 1)
	if err != nil {
		return World{}, err
	}
	if ok {
		if lr >= ls {
			return World{}, fmt.Errorf("%w: LOCAL_RANK=%d is not below LOCAL_WORLD_SIZE=%d", ErrEnv, lr, ls)
		}
		if ls > size {
			return World{}, fmt.Errorf("%w: LOCAL_WORLD_SIZE=%d is above WORLD_SIZE=%d", ErrEnv, ls, size)
		}
		w.LocalRank, w.LocalSize = lr, ls
	}
	node, nodes, ok, err := pair(get, "GROUP_RANK", "GROUP_WORLD_SIZE", 0, 1)
	if err != nil {
		return World{}, err
	}
	if ok {
		if node >= nodes {
			return World{}, fmt.Errorf("%w: GROUP_RANK=%d is not below GROUP_WORLD_SIZE=%d", ErrEnv, node, nodes)
		}
		w.Node, w.Nodes = node, nodes
	} else {
		w.Node, w.Nodes = rank/w.LocalSize, (size+w.LocalSize-1)/w.LocalSize
	}
	if err := checkSlurmAgrees(get, w); err != nil {
		return World{}, err
	}
	return master(get, w, func() (string, error) {
		return "", fmt.Errorf("%w: MASTER_ADDR is not set (WORLD_SIZE=%d needs rank 0's address)", ErrEnv, size)
	}, func() (int, error) {
		return 0, fmt.Errorf("%w: MASTER_PORT is not set (WORLD_SIZE=%d needs rank 0's port)", ErrEnv, size)
	})
}

// master fills MasterAddr and MasterPort from MASTER_ADDR and MASTER_PORT,
// asking addrFB and portFB for what is not set. With one rank, what is not
// set defaults to 127.0.0.1 and 0 (nobody needs to reach rank 0).
func master(get getter, w World, addrFB func() (string, error), portFB func() (int, error)) (World, error) {
	var err error
	if addr, ok := get("MASTER_ADDR"); ok {
		w.MasterAddr = addr
	} else if w.Size == 1 {
		w.MasterAddr = "127.0.0.1"
	} else if w.MasterAddr, err = addrFB(); err != nil {
		return World{}, err
	}
	if _, ok := get("MASTER_PORT"); ok {
		w.MasterPort, err = port(get, "MASTER_PORT")
	} else if w.Size > 1 {
		w.MasterPort, err = portFB()
	}
	if err != nil {
		return World{}, err
	}
	return w, nil
}

// isSlurmTask: srun started this process (a step's task).
func isSlurmTask(get getter) bool {
	_, procid := get("SLURM_PROCID")
	_, step := get("SLURM_STEP_ID")
	_, step2 := get("SLURM_STEPID")
	return procid && (step || step2)
}

func slurmSize(get getter) (int, string, error) {
	k := "SLURM_NTASKS"
	if _, ok := get(k); !ok {
		k = "SLURM_NPROCS"
	}
	if _, ok := get(k); !ok {
		return 0, "", fmt.Errorf("%w: SLURM_PROCID is set but SLURM_NTASKS is not", ErrEnv)
	}
	n, err := integer(get, k, 1)
	return n, k, err
}

func parseSlurm(get getter) (World, error) {
	rank, err := integer(get, "SLURM_PROCID", 0)
	if err != nil {
		return World{}, err
	}
	size, sizeVar, err := slurmSize(get)
	if err != nil {
		return World{}, err
	}
	if rank >= size {
		return World{}, fmt.Errorf("%w: SLURM_PROCID=%d is not below %s=%d", ErrEnv, rank, sizeVar, size)
	}
	w := World{Rank: rank, Size: size, Source: "slurm"}
	if w.LocalRank, err = integer(get, "SLURM_LOCALID", 0); err != nil {
		return World{}, err
	}
	w.Node = 0
	if _, ok := get("SLURM_NODEID"); ok {
		if w.Node, err = integer(get, "SLURM_NODEID", 0); err != nil {
			return World{}, err
		}
	}
	tpnVar := "SLURM_STEP_TASKS_PER_NODE"
	if _, ok := get(tpnVar); !ok {
		tpnVar = "SLURM_TASKS_PER_NODE"
	}
	if v, ok := get(tpnVar); ok {
		tpn, err := TasksPerNode(v)
		if err != nil {
			return World{}, fmt.Errorf("%w: %s: %w", ErrEnv, tpnVar, err)
		}
		if w.Node >= len(tpn) {
			return World{}, fmt.Errorf("%w: SLURM_NODEID=%d but %s=%q lists %d nodes", ErrEnv, w.Node, tpnVar, v, len(tpn))
		}
		w.LocalSize, w.Nodes = tpn[w.Node], len(tpn)
	} else {
		return World{}, fmt.Errorf("%w: neither SLURM_STEP_TASKS_PER_NODE nor SLURM_TASKS_PER_NODE is set", ErrEnv)
	}
	if w.LocalRank >= w.LocalSize {
		return World{}, fmt.Errorf("%w: SLURM_LOCALID=%d is not below this node's %d tasks (%s)", ErrEnv, w.LocalRank, w.LocalSize, tpnVar)
	}
	return master(get, w, func() (string, error) {
		for _, k := range []string{"SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST", "SLURM_NODELIST"} {
			if v, ok := get(k); ok {
				first, err := FirstNode(v)
				if err != nil {
					return "", fmt.Errorf("%w: %s: %w", ErrEnv, k, err)
				}
				return first, nil
			}
		}
		return "", fmt.Errorf("%w: neither MASTER_ADDR nor SLURM_JOB_NODELIST is set to take rank 0's host from", ErrEnv)
	}, func() (int, error) {
		job, ok := get("SLURM_JOB_ID")
		if !ok {
			job, ok = get("SLURM_JOBID")
		}
		if !ok {
			return 0, fmt.Errorf("%w: neither MASTER_PORT nor SLURM_JOB_ID is set to derive rank 0's port from", ErrEnv)
		}
		if strings.TrimLeft(job, "0123456789") != "" {
			return 0, fmt.Errorf("%w: SLURM_JOB_ID=%q is not a number (set MASTER_PORT)", ErrEnv, job)
		}
		if len(job) > 4 {
			job = job[len(job)-4:]
		}
		n, _ := strconv.Atoi(job)
		return 15000 + n, nil
	})
}

// checkSlurmAgrees catches a RANK that contradicts SLURM_PROCID where the
// two describe the same tasks (WORLD_SIZE = SLURM_NTASKS in an srun step).
func checkSlurmAgrees(get getter, w World) error {
	if !isSlurmTask(get) {
		return nil
	}
	size, sizeVar, err := slurmSize(get)
	if err != nil || size != w.Size {
		return nil // torchrun under srun: one task per node, several ranks each
	}
	procid, err := integer(get, "SLURM_PROCID", 0)
	if err != nil || procid == w.Rank {
		return nil
	}
	return fmt.Errorf("%w: RANK=%d but SLURM_PROCID=%d, with WORLD_SIZE = %s = %d: both number the same tasks and disagree (a RANK exported to every task?)",
		ErrEnv, w.Rank, procid, sizeVar, size)
}
