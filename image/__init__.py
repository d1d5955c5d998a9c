"""Data package (installed as ``toolcage_image``): the worker Dockerfile and its pinned requirements."""
