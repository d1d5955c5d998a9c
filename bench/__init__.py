"""Side-by-side timings of toolcage against plain `docker run` (run: python -m bench)."""
