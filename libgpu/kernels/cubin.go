package kernels

import (
	"bytes"
	"debug/elf"
	"encoding/binary"
	"fmt"
	"sort"
	"strings"
)

// A cubin is an ELF file (e_machine EM_CUDA = 190). What ParseCubin reads,
// and where the layout comes from:
//
//   - Arch: e_flags. ELF ABI version 7 (up to CUDA 12): SM number in bits
//     0-7, EF_CUDA_ACCELERATORS_V1 (0x800) marks "sm_90a". ABI version 8
//     (CUDA 13 and Blackwell): SM number in bits 8-15, EF_CUDA_ACCELERATORS
//     (0x8) marks the "a" target. The virtual (PTX) SM is bits 16-23 in
//     both. Source: LLVM llvm/include/llvm/BinaryFormat/ELF.h (EF_CUDA_*).
//   - Per-kernel attributes: ".nv.info" (global) and ".nv.info.<kernel>"
//     sections hold EIATTR records, each 4-byte aligned:
//     u8 format, u8 attribute, then for EIFMT_NVAL (1) nothing, EIFMT_BVAL (2)
//     one byte (padded to 4), EIFMT_HVAL (3) a u16 value, EIFMT_SVAL (4) a u16
//     length and that many bytes. The attributes read here: REGCOUNT (0x2f),
//     FRAME_SIZE (0x11), MIN_STACK_SIZE (0x12), MAX_STACK_SIZE (0x23), each an
//     SVAL of {u32 symbol index, u32 value}; MAX_THREADS (0x05, from
//     __launch_bounds__) and REQNTID (0x10), SVALs of {u32 x, y, z}. Sources:
//     NVIDIA's cuobjdump -elf output names these records; the attribute codes
//     and payload layouts are the ones documented by public cubin readers
//     (e.g. gdev's cuda/gdev_cuda.c, GVirtuS's CudaRt internal header, and the
//     nvopen-tools EIATTR catalogue for ptxas 13.0).
//   - Registers, when no REGCOUNT record exists: bits 24-31 of the sh_info
//     of ".text.<kernel>" (older cubins; the low 24 bits are the symbol index).
//   - Static shared memory: the size of ".nv.shared.<kernel>" (SHT_NOBITS).
//   - Local bytes: FRAME_SIZE, the per-thread stack frame that holds spills
//     and local arrays (what cuFuncGetAttribute reports as
//     CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES).
const (
	emCUDA = 190

	eifmtNVAL = 1
	eifmtBVAL = 2
	eifmtHVAL = 3
	eifmtSVAL = 4

	eiattrMaxThreads   = 0x05
	eiattrReqNTID      = 0x10
	eiattrFrameSize    = 0x11
	eiattrMinStackSize = 0x12
	eiattrMaxStackSize = 0x23
	eiattrRegCount     = 0x2f

	efCUDAAcceleratorsV1 = 0x800
	efCUDAAccelerators   = 0x8
)

// CubinInfo is the resource report of one cubin.
type CubinInfo struct {
	Arch        string       `json:"arch"`         // "sm_90a"
	VirtualArch string       `json:"virtual_arch"` // "compute_90a", the PTX it came from
	ABIVersion  int          `json:"abi_version"`  // ELF e_ident[EI_ABIVERSION]
	Kernels     []KernelInfo `json:"kernels"`      // sorted by name
}

// KernelInfo is what the cubin says about one kernel.
type KernelInfo struct {
	Name         string `json:"name"`         // the symbol (mangled unless extern "C")
	Registers    int    `json:"registers"`    // per thread
	SharedBytes  int64  `json:"shared_bytes"` // static shared memory per block
	LocalBytes   int64  `json:"local_bytes"`  // per-thread frame (spills, local arrays)
	MinStack     int64  `json:"min_stack"`    // bytes, EIATTR_MIN_STACK_SIZE
	MaxStack     int64  `json:"max_stack"`    // bytes, EIATTR_MAX_STACK_SIZE
	MaxThreads   int    `json:"max_threads"`  // __launch_bounds__ limit; 0: none in the cubin
	ReqThreads   [3]int `json:"req_threads"`  // required block size (REQNTID); zeros: none
	HasRegRecord bool   `json:"-"`            // REGCOUNT came from an EIATTR record
}

// ParseCubin reads the resource report of a cubin (no GPU needed). It fails
// with ErrNotCubin for anything that is not a 64-bit CUDA ELF, and never
// panics on malformed input.
func ParseCubin(data []byte) (info *CubinInfo, err error) {
	defer func() {
		if r := recover(); r != nil {
			info, err = nil, fmt.Errorf("%w: malformed ELF (%v)", ErrNotCubin, r)
		}
	}()
	f, err := elf.NewFile(bytes.NewReader(data))
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrNotCubin, err)
	}
	if f.Machine != emCUDA || f.Class != elf.ELFCLASS64 || f.Data != elf.ELFDATA2LSB || len(data) < 52 {
		return nil, fmt.Errorf("%w: e_machine %d, class %v", ErrNotCubin, f.Machine, f.Class)
	}
	flags := binary.LittleEndian.Uint32(data[48:52]) // e_flags of an ELF64 header
	info = &CubinInfo{ABIVersion: int(f.ABIVersion)}
	info.Arch, info.VirtualArch = archFromFlags(f.ABIVersion, flags)
	if a := archFromToolkitNote(f); a != "" {
		info.Arch = a
	}

	syms, _ := f.Symbols() // index i here is symbol table index i+1
	symName := func(idx uint32) string {
		if idx == 0 || int(idx) > len(syms) {
			return ""
		}
		return syms[idx-1].Name
	}

	kernels := map[string]*KernelInfo{}
	get := func(name string) *KernelInfo {
		k := kernels[name]
		if k == nil {
			k = &KernelInfo{Name: name}
			kernels[name] = k
		}
		return k
	}
	// Kernels: every function with a per-function .nv.info section.
	for _, s := range f.Sections {
		if n, ok := strings.CutPrefix(s.Name, ".nv.info."); ok && n != "" {
			get(n)
		}
	}
	if len(kernels) == 0 { // no per-function info: every .text.<name>
		for _, s := range f.Sections {
			if n, ok := strings.CutPrefix(s.Name, ".text."); ok && n != "" {
				get(n)
			}
		}
	}
	for _, s := range f.Sections {
		switch {
		case strings.HasPrefix(s.Name, ".text."):
			if k := kernels[s.Name[len(".text."):]]; k != nil && !k.HasRegRecord {
				k.Registers = int(s.Info >> 24)
			}
		case strings.HasPrefix(s.Name, ".nv.shared."):
			if k := kernels[s.Name[len(".nv.shared."):]]; k != nil {
				k.SharedBytes += int64(s.Size)
			}
		case s.Name == ".nv.info" || strings.HasPrefix(s.Name, ".nv.info."):
			b, err := s.Data()
			if err != nil {
				return nil, fmt.Errorf("%w: section %s: %v", ErrNotCubin, s.Name, err)
			}
			owner := kernels[strings.TrimPrefix(s.Name, ".nv.info.")]
			if s.Name == ".nv.info" {
				owner = nil
			}
			if err := walkEIATTR(b, func(attr byte, val []byte) {
				applyAttr(attr, val, owner, kernels, symName)
			}); err != nil {
				return nil, fmt.Errorf("%w: section %s: %v", ErrNotCubin, s.Name, err)
			}
		}
	}
	if sm, _, err := ParseArch(info.Arch); err == nil && sm >= 90 && f.Section(".nv.shared.reserved.0") != nil {
		// Measured with NVRTC 13.0 on an H200: on sm_90 the size of
		// ".nv.shared.<kernel>" includes the 1 KiB that the driver reserves per
		// block (CU_DEVICE_ATTRIBUTE_RESERVED_SHARED_MEMORY_PER_BLOCK), which
		// cuFuncGetAttribute's SHARED_SIZE_BYTES leaves out (2048 bytes of
		// section for a kernel with float tile[256]); sm_80 cubins do not.
		for _, k := range kernels {
			if k.SharedBytes >= reservedSharedSM90 {
				k.SharedBytes -= reservedSharedSM90
			}
		}
	}
	for _, k := range kernels {
		info.Kernels = append(info.Kernels, *k)
	}
	sort.Slice(info.Kernels, func(i, j int) bool { return info.Kernels[i].Name < info.Kernels[j].Name })
	return info, nil
}

// archFromFlags decodes e_flags (see the comment at the top of this file).
func archFromFlags(abi uint8, flags uint32) (arch, virt string) {
	var sm, vsm uint32
	var accel bool
	vsm = (flags >> 16) & 0xff
	if abi >= 8 {
		sm = (flags >> 8) & 0xff
		accel = flags&efCUDAAccelerators != 0
	} else {
		sm = flags & 0xff
		accel = flags&efCUDAAcceleratorsV1 != 0
	}
	suffix := ""
	if accel {
		suffix = "a"
	}
	if sm != 0 {
		arch = fmt.Sprintf("sm_%d%s", sm, suffix)
	}
	if vsm != 0 {
		virt = fmt.Sprintf("compute_%d%s", vsm, suffix)
	}
	return arch, virt
}

// walkEIATTR calls fn for each record of an .nv.info section.
func walkEIATTR(b []byte, fn func(attr byte, val []byte)) error {
	for len(b) > 0 {
		if len(b) < 2 {
			return fmt.Errorf("truncated record")
		}
		format, attr := b[0], b[1]
		switch format {
		case eifmtNVAL:
			// Two bytes, padded to four like every record (an sm_80 cubin
			// from NVRTC 13.0 has EIATTR 0x35 as 01 35 00 00).
			fn(attr, nil)
			b = b[min(4, len(b)):]
		case eifmtBVAL, eifmtHVAL:
			if len(b) < 4 {
				return fmt.Errorf("truncated record")
			}
			fn(attr, b[2:4])
			b = b[4:]
		case eifmtSVAL:
			if len(b) < 4 {
				return fmt.Errorf("truncated record")
			}
			n := int(binary.LittleEndian.Uint16(b[2:4]))
			if len(b) < 4+n {
				return fmt.Errorf("attribute 0x%02x: %d bytes, %d left", attr, n, len(b)-4)
			}
			fn(attr, b[4:4+n])
			b = b[4+n:]
		default:
			return fmt.Errorf("unknown record format %d", format)
		}
	}
	return nil
}

// applyAttr records one EIATTR. Records of the {symbol index, value} kind
// name their kernel themselves; the per-kernel ones belong to owner.
func applyAttr(attr byte, val []byte, owner *KernelInfo, kernels map[string]*KernelInfo, symName func(uint32) string) {
	u32 := func(i int) uint32 { return binary.LittleEndian.Uint32(val[4*i:]) }
	switch attr {
	case eiattrRegCount, eiattrFrameSize, eiattrMinStackSize, eiattrMaxStackSize:
		if len(val) < 8 {
			return
		}
		k := kernels[symName(u32(0))]
		if k == nil {
			return
		}
		v := u32(1)
		switch attr {
		case eiattrRegCount:
			k.Registers, k.HasRegRecord = int(v), true
		case eiattrFrameSize:
			k.LocalBytes = int64(v)
		case eiattrMinStackSize:
			k.MinStack = int64(v)
		case eiattrMaxStackSize:
			k.MaxStack = int64(v)
		}
	case eiattrMaxThreads, eiattrReqNTID:
		if owner == nil || len(val) < 12 {
			return
		}
		x, y, z := u32(0), u32(1), u32(2)
		if attr == eiattrMaxThreads {
			// Unused dimensions are 1 (or 0 in some writers).
			n := uint64(max(x, 1)) * uint64(max(y, 1)) * uint64(max(z, 1))
			if n > 1<<31 {
				n = 1 << 31
			}
			owner.MaxThreads = int(n)
		} else {
			owner.ReqThreads = [3]int{int(x & 0x7fffffff), int(y & 0x7fffffff), int(z & 0x7fffffff)}
		}
	}
}

// reservedSharedSM90 is the per-block shared memory the driver reserves on
// sm_90, included in sm_90 cubins' shared sections (see ParseCubin).
const reservedSharedSM90 = 1024

// archFromToolkitNote reads the real arch from the ".note.nv.tkinfo" note,
// which records ptxas's options ("-arch sm_90a"). CUDA 13's e_flags do not
// tell sm_90a from sm_90 (both 0x6005a04, measured on NVRTC 13.0); the note
// and .nv.compat do. Empty when the note is missing.
func archFromToolkitNote(f *elf.File) string {
	s := f.Section(".note.nv.tkinfo")
	if s == nil {
		return ""
	}
	b, err := s.Data()
	if err != nil {
		return ""
	}
	_, rest, ok := bytes.Cut(b, []byte("-arch sm_"))
	if !ok {
		return ""
	}
	end := bytes.IndexFunc(rest, func(r rune) bool { return !(r >= '0' && r <= '9' || r >= 'a' && r <= 'z') })
	if end <= 0 {
		return ""
	}
	return "sm_" + string(rest[:end])
}
