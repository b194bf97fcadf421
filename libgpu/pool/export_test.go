package pool

// mappedSlab says whether the client holds a mapping of slab id.
func (c *Client) mappedSlab(id uint64) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	_, ok := c.slabs[id]
	return ok
}
