package optim

import (
	"gpukit/libgpu/ops"
	"gpukit/libgpu/tensor"
)

// blockGroup is the parameters of one block-diagonal optimizer (Shampoo,
// SOAP) whose blocks have one shape [br, bc] and one treatment
// (preconditioned or not). Their blocks are stacked in member order in the
// group's buffers ([count, br, bc]) and, when preconditioned, at
// consecutive places of the statistics classes of orders br and bc, so
// that the statistics' update, the rotations and the preconditioning are
// batched GEMMs over the whole group: a handful of launches per block
// shape rather than per parameter.
type blockGroup struct {
	br, bc      int
	count       int            // blocks
	pre         bool           // preconditioned: places in the statistics classes
	members     []int          // the optimizer's indices of the member parameters
	blks        []ops.Blocking // per member
	offs        []int          // per member, its first block in the group
	left, right *statClass     // the classes of orders br and bc (pre only)
	offL, offR  int            // the group's first place in each
}

// groupByShape groups parameters by block shape and treatment, in order of
// each group's first member.
func groupByShape(blks []ops.Blocking, pre []bool) (groups []*blockGroup) {
	type key struct {
		br, bc int
		pre    bool
	}
	byKey := map[key]int{}
	for i, b := range blks {
		k := key{b.BR, b.BC, pre[i]}
		gi, ok := byKey[k]
		if !ok {
			gi = len(groups)
			byKey[k] = gi
			groups = append(groups, &blockGroup{br: b.BR, bc: b.BC, pre: pre[i]})
		}
		g := groups[gi]
		g.members = append(g.members, i)
		g.blks = append(g.blks, b)
		g.offs = append(g.offs, g.count)
		g.count += b.Count()
	}
	return groups
}

// place reserves the blocks of every preconditioned group, member by
// member, at consecutive places of cs's classes (left: the blocks' row
// order, right: their column order).
func placeGroups(groups []*blockGroup, cs *classes) {
	for _, g := range groups {
		if !g.pre {
			continue
		}
		g.left, g.offL = g.reserve(cs, g.br, ops.Blocking.RealRows)
		g.right, g.offR = g.reserve(cs, g.bc, ops.Blocking.RealCols)
	}
}

func (g *blockGroup) reserve(cs *classes, d int, real func(ops.Blocking, int) int) (*statClass, int) {
	var c *statClass
	off := -1
	for _, b := range g.blks {
		cc, o := cs.reserve(d, b.Count(), func(i int) int { return real(b, i) })
		if off < 0 {
			c, off = cc, o
		}
	}
	return c, off
}

// shape is the group's blocked shape [count, br, bc].
func (g *blockGroup) shape() []int { return []int{g.count, g.br, g.bc} }

// work views the first count·br·bc elements of a shared work buffer as the
// group's [count, br, bc].
func (g *blockGroup) work(t *tensor.Tensor) (*tensor.Tensor, error) { return flat(t, g.shape()...) }

// member views member i's blocks of a group tensor ([count, ...]).
func (g *blockGroup) member(t *tensor.Tensor, i int) (*tensor.Tensor, error) {
	return slice(t, g.offs[i], g.blks[i].Count())
}

// stats and outs view the group's places in its classes' statistics and
// results (left, then right).
func (g *blockGroup) stats() (l, r *tensor.Tensor, err error) {
	if l, err = slice(g.left.stats, g.offL, g.count); err != nil {
		return nil, nil, err
	}
	r, err = slice(g.right.stats, g.offR, g.count)
	return l, r, err
}

func (g *blockGroup) outs() (l, r *tensor.Tensor, err error) {
	if l, err = slice(g.left.out, g.offL, g.count); err != nil {
		return nil, nil, err
	}
	r, err = slice(g.right.out, g.offR, g.count)
	return l, r, err
}
