"""Semi-supervised detection: boxes around four kinds of weather events (SC17, ExtremeWeather)."""
