package store

import (
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A cursor lives parkCursorFor from the read of the group's start that
// set it, however often later locks move it on; a short lock drops it.
func TestParkCursorLifetime(t *testing.T) {
	p := newParkCursors()
	g := ParkedGroup{Tenant: "t", Model: "m", Lane: "normal"}
	t0 := time.Unix(1_000, 0)
	assert.Nil(t, p.start(g, t0), "no lock yet: from the start")

	p.took(g, nil, 0, 4, 4, t0.Add(-time.Minute), t0)
	from := p.start(g, t0.Add(parkCursorFor/2))
	require.NotNil(t, from)
	assert.Equal(t, t0.Add(-time.Minute), *from)

	p.took(g, from, 0, 4, 4, t0.Add(-30*time.Second), t0.Add(parkCursorFor/2))
	p.took(g, from, 0, 4, 4, t0.Add(-45*time.Second), t0.Add(parkCursorFor/2)) // a slower lock: the cursor does not go back
	from = p.start(g, t0.Add(parkCursorFor-time.Millisecond))
	require.NotNil(t, from)
	assert.Equal(t, t0.Add(-30*time.Second), *from)
	assert.Nil(t, p.start(g, t0.Add(parkCursorFor)), "read from the start again after parkCursorFor")

	p.took(g, nil, 0, 4, 4, t0, t0)
	from = p.start(g, t0)
	require.NotNil(t, from)
	p.took(g, from, 0, 4, 3, t0.Add(time.Second), t0)
	assert.Nil(t, p.start(g, t0), "a short lock drops the cursor")

	p.took(g, nil, 0, 4, 4, t0, t0)
	p.drop(g)
	p.took(g, &t0, 0, 4, 4, t0.Add(time.Second), t0)
	assert.Nil(t, p.start(g, t0), "a lock that started before a drop does not bring the cursor back")
}

// A group's last take (fewer rows than asked, from its start) sets no
// cursor, and cursors no take came back to are forgotten: the map does not
// keep one per group ever drained.
func TestDrainedGroupsLeaveNoCursor(t *testing.T) {
	p := newParkCursors()
	t0 := time.Unix(1_000, 0)
	for i := range 1000 {
		g := ParkedGroup{Tenant: fmt.Sprintf("t%d", i), Model: "m", Lane: "normal"}
		p.took(g, nil, 0, 128, 5, t0, t0) // the group's last rows
	}
	assert.Empty(t, p.m)
	for i := range 1000 {
		g := ParkedGroup{Tenant: fmt.Sprintf("t%d", i), Model: "m", Lane: "normal"}
		p.took(g, nil, 0, 128, 128, t0, t0)
	}
	p.took(ParkedGroup{Tenant: "later", Model: "m", Lane: "normal"}, nil, 0, 128, 128, t0, t0.Add(time.Hour))
	assert.Len(t, p.m, 1, "expired cursors are swept when one is set")
}
