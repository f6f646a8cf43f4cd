"""handoff's checklist as Fabric tasks (thin: parse flags, pick targets, call handoff/)."""
