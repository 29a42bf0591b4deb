"""Backbones: what every backbone is (base), the registry of kinds, one module per architecture."""
