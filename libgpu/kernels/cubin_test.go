package kernels_test

import (
	"errors"
	"os"
	"testing"

	"math/rand/v2"

	"gpukit/libgpu/kernels"
	"gpukit/libgpu/kernels/cubintest"
)

func TestParseCubinSynthetic(t *testing.T) {
	seed := rand.Uint64()
	t.Logf("seed %d", seed)
	r := rand.New(rand.NewPCG(seed, 1))
	for _, abi := range []struct {
		abi   byte
		sm    int
		accel bool
		arch  string
	}{{7, 90, true, "sm_90a"}, {7, 86, false, "sm_86"}, {8, 100, true, "sm_100a"}, {8, 120, false, "sm_120"}} {
		ks := []cubintest.Kernel{
			{Name: "gpukit_axpy", Registers: 1 + r.IntN(255), RegRecord: true, TextRegs: 1 + r.IntN(255),
				FrameBytes: int64(8 * r.IntN(100)), SharedBytes: int64(4 * r.IntN(12000))},
			{Name: "_Z12gpukit_scaleIfEvPT_S0_y", TextRegs: 1 + r.IntN(255), MaxThreads: [3]int{256, 1, 1},
				SharedBytes: 1024, MinStack: 16},
			{Name: "per_fn", Registers: 1 + r.IntN(255), RegRecord: true, PerFunctionRecords: true,
				FrameBytes: 24, MaxThreads: [3]int{8, 8, 2}},
		}
		img := cubintest.Build(cubintest.Cubin{ABIVersion: abi.abi, Flags: cubintest.Flags(abi.abi, abi.sm, abi.accel), Kernels: ks})
		info, err := kernels.ParseCubin(img)
		if err != nil {
			t.Fatalf("%s: %v", abi.arch, err)
		}
		if info.Arch != abi.arch || info.ABIVersion != int(abi.abi) {
			t.Errorf("arch %q abi %d, want %q %d", info.Arch, info.ABIVersion, abi.arch, abi.abi)
		}
		if len(info.Kernels) != len(ks) {
			t.Fatalf("%d kernels, want %d: %+v", len(info.Kernels), len(ks), info.Kernels)
		}
		byName := map[string]kernels.KernelInfo{}
		for _, k := range info.Kernels {
			byName[k.Name] = k
		}
		for _, want := range ks {
			got, ok := byName[want.Name]
			if !ok {
				t.Fatalf("kernel %s missing", want.Name)
			}
			regs := want.TextRegs
			if want.RegRecord {
				regs = want.Registers
			}
			mt := 0
			if want.MaxThreads != [3]int{} {
				mt = want.MaxThreads[0] * want.MaxThreads[1] * want.MaxThreads[2]
			}
			if got.Registers != regs || got.SharedBytes != want.SharedBytes || got.LocalBytes != want.FrameBytes ||
				got.MaxThreads != mt || got.MinStack != want.MinStack {
				t.Errorf("%s %s: got %+v, want regs %d shared %d local %d maxthreads %d minstack %d",
					abi.arch, want.Name, got, regs, want.SharedBytes, want.FrameBytes, mt, want.MinStack)
			}
		}
	}
}

func TestParseCubinRejects(t *testing.T) {
	self, err := os.Executable() // a host ELF, not a cubin
	if err != nil {
		t.Fatal(err)
	}
	host, err := os.ReadFile(self)
	if err != nil {
		t.Fatal(err)
	}
	good := cubintest.Build(cubintest.Cubin{ABIVersion: 7, Flags: cubintest.Flags(7, 90, true),
		Kernels: []cubintest.Kernel{{Name: "k", Registers: 10, RegRecord: true, FrameBytes: 8}}})
	for name, b := range map[string][]byte{
		"empty": nil, "text": []byte("// PTX .version 8.0"), "host ELF": host[:min(len(host), 1<<20)],
		"truncated": good[:len(good)/2],
	} {
		if _, err := kernels.ParseCubin(b); !errors.Is(err, kernels.ErrNotCubin) {
			t.Errorf("%s: %v, want ErrNotCubin", name, err)
		}
	}
}

func FuzzParseCubin(f *testing.F) {
	f.Add(cubintest.Build(cubintest.Cubin{ABIVersion: 7, Flags: cubintest.Flags(7, 90, true),
		Kernels: []cubintest.Kernel{{Name: "k", Registers: 10, RegRecord: true, FrameBytes: 8, SharedBytes: 64}}}))
	f.Add(cubintest.Build(cubintest.Cubin{ABIVersion: 8, Flags: cubintest.Flags(8, 100, false),
		Kernels: []cubintest.Kernel{{Name: "a", TextRegs: 3, MaxThreads: [3]int{128, 1, 1}}, {Name: "b", PerFunctionRecords: true, RegRecord: true, Registers: 4}}}))
	f.Fuzz(func(t *testing.T, b []byte) {
		info, err := kernels.ParseCubin(b)
		if err == nil && info == nil {
			t.Fatal("nil info without error")
		}
	})
}
