-- luacheck configuration: LuaJIT everywhere, Busted globals in specs.
std = "luajit"
max_line_length = 120
-- Specs quote exact error messages, which can be long.
files["tests/spec/**/*_spec.lua"] = { std = "+busted", max_line_length = 140 }
exclude_files = { "lua/tinyloop/cdef.lua" }

files["tests/spec/helpers.lua"] = { std = "+busted" }
