package ops_test

import (
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"

	"gpukit/libgpu/device"
	"gpukit/libgpu/ops"
	"gpukit/libgpu/ops/opstest"
	"gpukit/libgpu/tensor"
)

// FuzzParseAct: ParseAct never panics, accepts exactly the names String
// produces, and round-trips them.
func FuzzParseAct(f *testing.F) {
	for _, s := range []string{"none", "relu", "gelu", "GELU", "", "act(3)"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		a, err := ops.ParseAct(s)
		if err != nil {
			return
		}
		if a.String() != s {
			t.Fatalf("ParseAct(%q) = %v, which prints as %q", s, a, a.String())
		}
	})
}

// TestParsePrecision: the three names give the three precisions; anything
// else is an error that names the choices.
func TestParsePrecision(t *testing.T) {
	for s, want := range map[string]ops.Precision{"f32": ops.PrecF32, "tf32": ops.PrecTF32, "bf16": ops.PrecBF16} {
		if got, err := ops.ParsePrecision(s); err != nil || got != want {
			t.Errorf("ParsePrecision(%q) = %v, %v; want %v", s, got, err, want)
		}
	}
	for _, s := range []string{"", "f16", "BF16", "fp32"} {
		if _, err := ops.ParsePrecision(s); err == nil || !strings.Contains(err.Error(), "want f32, tf32 or bf16") {
			t.Errorf("ParsePrecision(%q): error %v", s, err)
		}
	}
}

func BenchmarkHostLinear(b *testing.B) {
	for _, sh := range [][3]int{{256, 784, 256}, {256, 256, 10}} {
		m, k, n := sh[0], sh[1], sh[2]
		b.Run(fmt.Sprintf("%dx%dx%d", m, k, n), func(b *testing.B) {
			h := device.NewHost()
			a := device.Local{Dev: h}
			e, err := ops.NewEngine(h, ops.Options{})
			if err != nil {
				b.Fatal(err)
			}
			r := rand.New(rand.NewPCG(1, 2))
			x := opstest.Upload(b, a, opstest.Rand(r, m*k), m, k)
			w := opstest.Upload(b, a, opstest.Rand(r, n*k), n, k)
			bias := opstest.Upload(b, a, opstest.Rand(r, n), n)
			y := opstest.Empty(b, a, tensor.F32, m, n)
			aux := opstest.Empty(b, a, tensor.F32, m, n)
			b.SetBytes(int64(4 * (m*k + n*k + m*n)))
			for b.Loop() {
				if err := e.Linear(y, x, w, bias, aux, ops.ActGELU); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(2*m*n*k)*float64(b.N)/b.Elapsed().Seconds()/1e9, "GFLOP/s")
		})
	}
}
