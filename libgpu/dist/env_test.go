package dist

import (
	"errors"
	"reflect"
	"strings"
	"testing"
)

func env(kv ...string) func(string) (string, bool) {
	m := map[string]string{}
	for _, s := range kv {
		k, v, _ := strings.Cut(s, "=")
		m[k] = v
	}
	return func(k string) (string, bool) { v, ok := m[k]; return v, ok }
}

var slurm2x2 = []string{ // srun -N2 --ntasks-per-node=2: task 3 on the second node
	"SLURM_JOB_ID=123456", "SLURM_STEP_ID=0", "SLURM_PROCID=3", "SLURM_NTASKS=4", "SLURM_LOCALID=1",
	"SLURM_NODEID=1", "SLURM_STEP_TASKS_PER_NODE=2(x2)", "SLURM_TASKS_PER_NODE=4(x2)",
	"SLURM_JOB_NODELIST=gpu[01-04,07],login1", "SLURM_STEP_NODELIST=gpu[03-04]",
}

func TestParse(t *testing.T) {
	cases := []struct {
		name string
		env  []string
		want World
	}{
		{"nothing", nil, Single()},
		{"torchrun", []string{"RANK=5", "WORLD_SIZE=8", "LOCAL_RANK=1", "LOCAL_WORLD_SIZE=4", "GROUP_RANK=1",
			"GROUP_WORLD_SIZE=2", "MASTER_ADDR=node0", "MASTER_PORT=29500"},
			World{Rank: 5, Size: 8, LocalRank: 1, LocalSize: 4, Node: 1, Nodes: 2, MasterAddr: "node0",
				MasterPort: 29500, RendezvousPort: 29500, Source: "torchrun"}},
		{"torchrun without locals or groups: one machine", []string{"RANK=2", "WORLD_SIZE=3", "MASTER_ADDR=h", "MASTER_PORT=1"},
			World{Rank: 2, Size: 3, LocalRank: 2, LocalSize: 3, Node: 0, Nodes: 1, MasterAddr: "h", MasterPort: 1,
				RendezvousPort: 1, Source: "torchrun"}},
		{"torchrun without groups: uniform machines", []string{"RANK=5", "WORLD_SIZE=8", "LOCAL_RANK=1", "LOCAL_WORLD_SIZE=4",
			"MASTER_ADDR=h", "MASTER_PORT=2"},
			World{Rank: 5, Size: 8, LocalRank: 1, LocalSize: 4, Node: 1, Nodes: 2, MasterAddr: "h", MasterPort: 2,
				RendezvousPort: 2, Source: "torchrun"}},
		{"one rank needs no master", []string{"RANK=0", "WORLD_SIZE=1"},
			World{Size: 1, LocalSize: 1, Nodes: 1, MasterAddr: "127.0.0.1", Source: "torchrun"}},
		{"torchrun's agent store holds MASTER_PORT", []string{"RANK=0", "WORLD_SIZE=2", "MASTER_ADDR=h", "MASTER_PORT=29500",
			"TORCHELASTIC_USE_AGENT_STORE=True"},
			World{Size: 2, LocalSize: 2, Nodes: 1, MasterAddr: "h", MasterPort: 29500, RendezvousPort: 29501, Source: "torchrun"}},
		{"rendezvous port override", []string{"RANK=1", "WORLD_SIZE=2", "MASTER_ADDR=h", "MASTER_PORT=29500",
			"TORCHELASTIC_USE_AGENT_STORE=True", "GPUKIT_RENDEZVOUS_PORT=40000"},
			World{Rank: 1, Size: 2, LocalRank: 1, LocalSize: 2, Nodes: 1, MasterAddr: "h", MasterPort: 29500,
				RendezvousPort: 40000, Source: "torchrun"}},
		{"slurm", slurm2x2,
			World{Rank: 3, Size: 4, LocalRank: 1, LocalSize: 2, Node: 1, Nodes: 2, MasterAddr: "gpu03",
				MasterPort: 18456, RendezvousPort: 18456, Source: "slurm"}},
		{"slurm with the job's lists only and MASTER_*", []string{"SLURM_STEPID=0", "SLURM_PROCID=0", "SLURM_NPROCS=3",
			"SLURM_LOCALID=0", "SLURM_TASKS_PER_NODE=1(x3)", "SLURM_JOB_NODELIST=gpu[01-04,07],login1", "MASTER_PORT=7000"},
			World{Size: 3, LocalSize: 1, Nodes: 3, MasterAddr: "gpu01", MasterPort: 7000, RendezvousPort: 7000, Source: "slurm"}},
		{"slurm batch script: one process", []string{"SLURM_JOB_ID=9", "SLURM_PROCID=0", "SLURM_NTASKS=8", "SLURM_LOCALID=0"},
			Single()},
		{"torchrun under srun: torchrun's numbers", append([]string{"RANK=6", "WORLD_SIZE=8", "LOCAL_RANK=2",
			"LOCAL_WORLD_SIZE=4", "MASTER_ADDR=gpu03", "MASTER_PORT=29500"}, slurm2x2...),
			World{Rank: 6, Size: 8, LocalRank: 2, LocalSize: 4, Node: 1, Nodes: 2, MasterAddr: "gpu03",
				MasterPort: 29500, RendezvousPort: 29500, Source: "torchrun"}},
	}
	for _, c := range cases {
		got, err := Parse(env(c.env...))
		if err != nil {
			t.Errorf("%s: %v", c.name, err)
			continue
		}
		if got != c.want {
			t.Errorf("%s:\n got %+v\nwant %+v", c.name, got, c.want)
		}
	}
}

func TestParseErrors(t *testing.T) {
	cases := []struct {
		name string
		env  []string
		want string // in the message
	}{
		{"RANK alone", []string{"RANK=0"}, "RANK is set but WORLD_SIZE is not"},
		{"WORLD_SIZE alone", []string{"WORLD_SIZE=2"}, "WORLD_SIZE is set but RANK is not"},
		{"rank too big", []string{"RANK=2", "WORLD_SIZE=2"}, "RANK=2 is not below WORLD_SIZE=2"},
		{"not a number", []string{"RANK=one", "WORLD_SIZE=2"}, `RANK="one": want an integer ≥ 0`},
		{"empty world", []string{"RANK=0", "WORLD_SIZE=0"}, "WORLD_SIZE=\"0\": want an integer ≥ 1"},
		{"LOCAL_RANK alone", []string{"RANK=0", "WORLD_SIZE=2", "LOCAL_RANK=0"}, "LOCAL_RANK is set but LOCAL_WORLD_SIZE is not"},
		{"local rank too big", []string{"RANK=0", "WORLD_SIZE=4", "LOCAL_RANK=2", "LOCAL_WORLD_SIZE=2"},
			"LOCAL_RANK=2 is not below LOCAL_WORLD_SIZE=2"},
		{"local size above world", []string{"RANK=0", "WORLD_SIZE=2", "LOCAL_RANK=0", "LOCAL_WORLD_SIZE=4"},
			"LOCAL_WORLD_SIZE=4 is above WORLD_SIZE=2"},
		{"no master addr", []string{"RANK=0", "WORLD_SIZE=2", "MASTER_PORT=1"}, "MASTER_ADDR is not set"},
		{"no master port", []string{"RANK=1", "WORLD_SIZE=2", "MASTER_ADDR=h"}, "MASTER_PORT is not set"},
		{"port out of range", []string{"RANK=0", "WORLD_SIZE=2", "MASTER_ADDR=h", "MASTER_PORT=70000"},
			"MASTER_PORT=\"70000\": want a TCP port in 1..65535"},
		{"agent store port + 1 out of range", []string{"RANK=0", "WORLD_SIZE=2", "MASTER_ADDR=h", "MASTER_PORT=65535",
			"TORCHELASTIC_USE_AGENT_STORE=True"}, "set GPUKIT_RENDEZVOUS_PORT"},
		{"exported RANK under srun", append([]string{"RANK=0", "WORLD_SIZE=4", "MASTER_ADDR=h", "MASTER_PORT=1"}, slurm2x2...),
			"RANK=0 but SLURM_PROCID=3"},
		{"slurm without ntasks", []string{"SLURM_STEP_ID=0", "SLURM_PROCID=0", "SLURM_LOCALID=0"},
			"SLURM_PROCID is set but SLURM_NTASKS is not"},
		{"slurm localid beyond the node's tasks", []string{"SLURM_STEP_ID=0", "SLURM_PROCID=1", "SLURM_NTASKS=2",
			"SLURM_LOCALID=1", "SLURM_STEP_TASKS_PER_NODE=1(x2)", "SLURM_NODEID=1", "SLURM_JOB_NODELIST=a,b", "SLURM_JOB_ID=1"},
			"SLURM_LOCALID=1 is not below this node's 1 tasks"},
		{"slurm node beyond the list", []string{"SLURM_STEP_ID=0", "SLURM_PROCID=1", "SLURM_NTASKS=2",
			"SLURM_LOCALID=0", "SLURM_STEP_TASKS_PER_NODE=2", "SLURM_NODEID=1"}, "lists 1 nodes"},
		{"slurm bad node list", []string{"SLURM_STEP_ID=0", "SLURM_PROCID=0", "SLURM_NTASKS=2", "SLURM_LOCALID=0",
			"SLURM_STEP_TASKS_PER_NODE=2", "SLURM_JOB_NODELIST=gpu[01-", "SLURM_JOB_ID=5"}, "SLURM_JOB_NODELIST"},
		{"slurm without a job id or port", []string{"SLURM_STEP_ID=0", "SLURM_PROCID=0", "SLURM_NTASKS=2", "SLURM_LOCALID=0",
			"SLURM_STEP_TASKS_PER_NODE=2", "SLURM_JOB_NODELIST=gpu01"}, "neither MASTER_PORT nor SLURM_JOB_ID"},
	}
	for _, c := range cases {
		_, err := Parse(env(c.env...))
		if !errors.Is(err, ErrEnv) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: error %v, want ErrEnv saying %q", c.name, err, c.want)
		}
	}
}

// TestEnvRoundTrip: what trainer launch sets for a child parses back into
// the same World.
func TestEnvRoundTrip(t *testing.T) {
	w := World{Rank: 5, Size: 8, LocalRank: 1, LocalSize: 4, Node: 1, Nodes: 2, MasterAddr: "10.0.0.1",
		MasterPort: 29400, RendezvousPort: 29400, Source: "torchrun"}
	got, err := Parse(env(w.Env()...))
	if err != nil || got != w {
		t.Fatalf("Parse(Env()) = %+v, %v\nwant %+v", got, err, w)
	}
}

func TestDeviceOrdinal(t *testing.T) {
	w := World{Rank: 3, Size: 4, LocalRank: 1, LocalSize: 2}
	for _, c := range []struct{ visible, want int }{{2, 1}, {8, 1}, {1, 0}} {
		if got, err := w.DeviceOrdinal(c.visible); err != nil || got != c.want {
			t.Errorf("%d visible: %d, %v; want %d", c.visible, got, err, c.want)
		}
	}
	w.LocalRank = 2
	if _, err := w.DeviceOrdinal(2); !errors.Is(err, ErrEnv) {
		t.Errorf("local rank 2 with 2 GPUs: %v", err)
	}
}

func TestExpandNodeList(t *testing.T) {
	cases := []struct {
		in   string
		want []string
	}{
		{"login1", []string{"login1"}},
		{"gpu[01-04,07],login1", []string{"gpu01", "gpu02", "gpu03", "gpu04", "gpu07", "login1"}},
		{"n[8-11]", []string{"n8", "n9", "n10", "n11"}},
		{"n[098-101]x", []string{"n098x", "n099x", "n100x", "n101x"}},
		{"r[1-2]n[08-09],a,b[3]", []string{"r1n08", "r1n09", "r2n08", "r2n09", "a", "b3"}},
		{"h-[1,3]-ib", []string{"h-1-ib", "h-3-ib"}},
	}
	for _, c := range cases {
		got, err := ExpandNodeList(c.in)
		if err != nil || !reflect.DeepEqual(got, c.want) {
			t.Errorf("ExpandNodeList(%q) = %q, %v; want %q", c.in, got, err, c.want)
		}
		first, err := FirstNode(c.in)
		if err != nil || first != c.want[0] {
			t.Errorf("FirstNode(%q) = %q, %v", c.in, first, err)
		}
	}
	for _, bad := range []string{"", "a,,b", "gpu[01-", "gpu01]", "gpu[3-1]", "gpu[a-b]", "gpu[]", "g[1-[2]]", "n[0-99999999]", "n[-3]"} {
		if got, err := ExpandNodeList(bad); !errors.Is(err, ErrNodeList) {
			t.Errorf("ExpandNodeList(%q) = %q, %v; want ErrNodeList", bad, got, err)
		}
	}
	// A huge list is refused without expanding it.
	if _, err := ExpandNodeList("a[0-999999],b[0-999999]"); !errors.Is(err, ErrNodeList) {
		t.Errorf("two million hosts: %v", err)
	}
}

func TestTasksPerNode(t *testing.T) {
	cases := []struct {
		in   string
		want []int
	}{
		{"4", []int{4}},
		{"2(x3),1", []int{2, 2, 2, 1}},
		{"1,2(x2)", []int{1, 2, 2}},
	}
	for _, c := range cases {
		got, err := TasksPerNode(c.in)
		if err != nil || !reflect.DeepEqual(got, c.want) {
			t.Errorf("TasksPerNode(%q) = %v, %v; want %v", c.in, got, err, c.want)
		}
	}
	for _, bad := range []string{"", "x", "2(3)", "2(x0)", "2(x3", "-1", "2(x99999999)"} {
		if got, err := TasksPerNode(bad); !errors.Is(err, ErrNodeList) {
			t.Errorf("TasksPerNode(%q) = %v, %v; want ErrNodeList", bad, got, err)
		}
	}
}
