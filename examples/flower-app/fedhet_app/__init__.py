"""fedhet as a Flower App."""
