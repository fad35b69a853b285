"""lowtide's wire protocol: ``lowtide.proto`` and the code generated from it at install."""
