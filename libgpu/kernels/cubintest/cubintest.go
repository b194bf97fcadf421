package cubintest

import (
	"encoding/binary"
)

// Kernel describes one kernel of a synthetic cubin.
type Kernel struct {
	Name        string
	Registers   int    // written as an EIATTR_REGCOUNT record when RegRecord
	RegRecord   bool   // false: registers only in .text sh_info bits 24-31
	TextRegs    int    // the value put in sh_info bits 24-31
	SharedBytes int64  // size of .nv.shared.<name>; 0: no such section
	FrameBytes  int64  // EIATTR_FRAME_SIZE; 0: no record
	MinStack    int64  // EIATTR_MIN_STACK_SIZE; 0: no record
	MaxThreads  [3]int // EIATTR_MAX_THREADS; zeros: no record
	// PerFunctionRecords puts the REGCOUNT/FRAME_SIZE records in
	// .nv.info.<name> instead of the global .nv.info (both occur).
	PerFunctionRecords bool
}

// Cubin describes a synthetic cubin.
type Cubin struct {
	ABIVersion byte   // 7 (CUDA <= 12) or 8 (CUDA 13)
	Flags      uint32 // e_flags
	Kernels    []Kernel
}

// Flags returns e_flags for sm (90) with or without the "a" suffix in the
// given ABI version's layout (see libgpu/kernels/cubin.go).
func Flags(abi byte, sm int, accel bool) uint32 {
	f := uint32(sm) << 16 // virtual SM
	if abi >= 8 {
		f |= uint32(sm) << 8
		if accel {
			f |= 0x8
		}
	} else {
		f |= uint32(sm)
		if accel {
			f |= 0x800
		}
	}
	return f
}

const (
	shtProgbits = 1
	shtSymtab   = 2
	shtStrtab   = 3
	shtNobits   = 8
	shtCUDAInfo = 0x70000000
)

type section struct {
	name                string
	typ                 uint32
	flags               uint64
	data                []byte
	size                uint64 // for NOBITS
	link, info, entsize uint32
}

// Build returns the ELF bytes of c.
func Build(c Cubin) []byte {
	le := binary.LittleEndian
	secs := []section{{}} // index 0: null
	add := func(s section) int { secs = append(secs, s); return len(secs) - 1 }
	shstr := add(section{name: ".shstrtab", typ: shtStrtab})
	strtab := add(section{name: ".strtab", typ: shtStrtab})
	symtab := add(section{name: ".symtab", typ: shtSymtab, link: uint32(strtab), entsize: 24})
	global := add(section{name: ".nv.info", typ: shtCUDAInfo, link: uint32(symtab)})

	strs := []byte{0}
	syms := make([]byte, 24) // symbol 0: null
	rec := func(b []byte, attr byte, vals ...uint32) []byte {
		b = append(b, 4, attr)
		b = le.AppendUint16(b, uint16(4*len(vals)))
		for _, v := range vals {
			b = le.AppendUint32(b, v)
		}
		return b
	}
	for i, k := range c.Kernels {
		symIdx := uint32(i + 1)
		text := add(section{name: ".text." + k.Name, typ: shtProgbits, flags: 0x6,
			data: make([]byte, 128), info: uint32(k.TextRegs)<<24 | symIdx, link: uint32(symtab)})
		var per []byte
		var recs []byte
		if k.RegRecord {
			recs = rec(recs, 0x2f, symIdx, uint32(k.Registers))
		}
		if k.FrameBytes != 0 {
			recs = rec(recs, 0x11, symIdx, uint32(k.FrameBytes))
		}
		if k.MinStack != 0 {
			recs = rec(recs, 0x12, symIdx, uint32(k.MinStack))
		}
		if k.PerFunctionRecords {
			per = append(per, recs...)
		} else {
			secs[global].data = append(secs[global].data, recs...)
		}
		per = append(per, 1, 0x2a, 0, 0)       // an NVAL record (EIATTR_SW1850030_WAR), padded to 4 bytes as NVRTC writes it, to be skipped
		per = append(per, 3, 0x19, 0x20, 0x00) // an HVAL record (CBANK_PARAM_SIZE 32)
		if k.MaxThreads != [3]int{} {
			per = rec(per, 0x05, uint32(k.MaxThreads[0]), uint32(k.MaxThreads[1]), uint32(k.MaxThreads[2]))
		}
		add(section{name: ".nv.info." + k.Name, typ: shtCUDAInfo, data: per, link: uint32(symtab), info: uint32(text)})
		if k.SharedBytes > 0 {
			add(section{name: ".nv.shared." + k.Name, typ: shtNobits, flags: 0x3, size: uint64(k.SharedBytes)})
		}
		// symbol: name, info (STB_GLOBAL<<4 | STT_FUNC), other (STO_CUDA_ENTRY 0x10), shndx, value, size
		sym := make([]byte, 24)
		le.PutUint32(sym[0:], uint32(len(strs)))
		sym[4] = 1<<4 | 2
		sym[5] = 0x10
		le.PutUint16(sym[6:], uint16(text))
		le.PutUint64(sym[16:], 128)
		syms = append(syms, sym...)
		strs = append(append(strs, k.Name...), 0)
	}
	secs[strtab].data = strs
	secs[symtab].data = syms
	secs[symtab].info = 1 // first non-local symbol
	var shs []byte = []byte{0}
	nameOff := make([]uint32, len(secs))
	for i := 1; i < len(secs); i++ {
		nameOff[i] = uint32(len(shs))
		shs = append(append(shs, secs[i].name...), 0)
	}
	secs[shstr].data = shs

	out := make([]byte, 64)
	offs := make([]uint64, len(secs))
	for i := 1; i < len(secs); i++ {
		for len(out)%8 != 0 {
			out = append(out, 0)
		}
		offs[i] = uint64(len(out))
		if secs[i].typ != shtNobits {
			out = append(out, secs[i].data...)
		}
	}
	for len(out)%8 != 0 {
		out = append(out, 0)
	}
	shoff := uint64(len(out))
	for i, s := range secs {
		h := make([]byte, 64)
		if i > 0 {
			size := uint64(len(s.data))
			if s.typ == shtNobits {
				size = s.size
			}
			le.PutUint32(h[0:], nameOff[i])
			le.PutUint32(h[4:], s.typ)
			le.PutUint64(h[8:], s.flags)
			le.PutUint64(h[24:], offs[i])
			le.PutUint64(h[32:], size)
			le.PutUint32(h[40:], s.link)
			le.PutUint32(h[44:], s.info)
			le.PutUint64(h[48:], 4)
			le.PutUint64(h[56:], uint64(s.entsize))
		}
		out = append(out, h...)
	}
	copy(out, []byte{0x7f, 'E', 'L', 'F', 2, 1, 1, 0x33, c.ABIVersion})
	le.PutUint16(out[16:], 2)   // ET_EXEC
	le.PutUint16(out[18:], 190) // EM_CUDA
	le.PutUint32(out[20:], 1)
	le.PutUint64(out[40:], shoff)
	le.PutUint32(out[48:], c.Flags)
	le.PutUint16(out[52:], 64)
	le.PutUint16(out[54:], 56)
	le.PutUint16(out[58:], 64)
	le.PutUint16(out[60:], uint16(len(secs)))
	le.PutUint16(out[62:], uint16(shstr))
	return out
}
