"""The dev server: hosts the site, shaders and models (with HTTP Range). It does no inference."""
