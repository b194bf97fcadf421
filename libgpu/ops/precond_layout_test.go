package ops

import (
	"os"
	"regexp"
	"strconv"
	"testing"
)

// The multi-tensor element-wise steps of precond.cu and newtonschulz.cu
// share the plan of ops_optim.cu's (mtPlan): the same tensors per launch (also tied at
// compile time: the generated Start arrays are [PC_MT_MAX+1]int32 and take
// mtGroup.start) and the same elements per block, which only this checks.
func TestPrecondMultiPlanMatchesKernels(t *testing.T) {
	for _, c := range []struct {
		file, name string
		want       int
	}{
		{"precond.cu", "PC_MT_CHUNK", mtChunk},
		{"precond.cu", "PC_MT_MAX", mtMax},
		{"ops_optim.cu", "OPS_MT_CHUNK", mtChunk},
		{"ops_optim.cu", "OPS_MT_MAX", mtMax},
		{"newtonschulz.cu", "MUON_MT_CHUNK", mtChunk},
		{"newtonschulz.cu", "MUON_MT_MAX", mtMax},
	} {
		b, err := os.ReadFile("../kernels/" + c.file)
		if err != nil {
			t.Fatal(err)
		}
		m := regexp.MustCompile(`(?m)^#define ` + c.name + ` (\d+)$`).FindSubmatch(b)
		if m == nil {
			t.Fatalf("%s: no #define %s", c.file, c.name)
		}
		if n, _ := strconv.Atoi(string(m[1])); n != c.want {
			t.Errorf("%s: %s is %d, libgpu/ops plans with %d", c.file, c.name, n, c.want)
		}
	}
}
