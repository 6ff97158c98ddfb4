"""Pure shared vocabulary: the cause rules, the off-CPU pro-rating weights, the
GPU clock-event-reason bits, the live-event kinds and the store's schema
constants. Every other package may import it; it imports nothing of ours but
itself, does no I/O and holds no state."""
