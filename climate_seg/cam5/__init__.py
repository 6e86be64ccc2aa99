"""CAM5 data both climate tasks read: the variables and grid, netCDF conversion, statistics, synthetic fields."""
