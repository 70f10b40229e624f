"""The studies floor: decisions built on the floors below (procurement, MODEL.md §8; the advisor evaluation)."""
