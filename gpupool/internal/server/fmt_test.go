package server

import (
	"encoding/hex"
	"fmt"
)

func fmtSscan(s string, a ...any) (int, error) { return fmt.Sscan(s, a...) }

func hexString(b []byte) string { return hex.EncodeToString(b) }
