-- gen_cdef.lua - turns engine/tinyloop.h into the macro-free declaration
-- text that ffi.cdef reads, written as a Lua module returning that string.
--
--   luajit bindings/gen_cdef.lua engine/tinyloop.h lua/tinyloop/cdef.lua
--
-- Kept: typedefs, enums, structs, prototypes. Dropped: comments, every
-- preprocessor line, and whatever sits inside `#ifdef __cplusplus` blocks
-- (the extern "C" braces). The header is expected to stay plain C: no
-- macros in declarations (ffi.cdef has no preprocessor), which the
-- bindings spec checks by feeding the output to ffi.cdef.

local input, output = arg[1], arg[2]
if not input or not output then
    io.stderr:write("usage: luajit gen_cdef.lua HEADER OUT.lua\n")
    os.exit(2)
end

local f = assert(io.open(input, "rb"))
local src = f:read("*a")
f:close()

-- Comments first, so a "/*" inside a line comment or a "#" inside a
-- comment cannot confuse the line-based passes below. Block comments keep
-- their newlines so line structure survives.
src = src:gsub("/%*(.-)%*/", function(body)
    return (body:gsub("[^\n]", ""))
end)
src = src:gsub("//[^\n]*", "")
src = src:gsub("\\\n", " ") -- joined continuation lines (multi-line macros)

local out, depth_cpp, depth = {}, 0, 0
for line in (src .. "\n"):gmatch("([^\n]*)\n") do
    local directive = line:match("^%s*#%s*(%a+)")
    if directive then
        if directive == "if" or directive == "ifdef" or directive == "ifndef" then
            depth = depth + 1
            if depth_cpp == 0 and line:match("__cplusplus") then depth_cpp = depth end
        elseif directive == "endif" then
            if depth == depth_cpp then depth_cpp = 0 end
            depth = depth - 1
        end
    elseif depth_cpp == 0 and not line:match('^%s*extern%s+"C"') then
        out[#out + 1] = (line:gsub("%s+$", ""))
    end
end

local text = table.concat(out, "\n")
text = text:gsub("\n\n\n+", "\n\n"):gsub("^\n+", ""):gsub("\n*$", "\n")
if text:find("]==]", 1, true) then
    io.stderr:write("gen_cdef: header text contains ']==]'\n")
    os.exit(1)
end

local tmp = output .. ".tmp"
local o = assert(io.open(tmp, "wb"))
o:write("-- Generated from ", input, " by bindings/gen_cdef.lua; do not edit.\n",
    "return [==[\n", text, "]==]\n")
o:close()
assert(os.rename(tmp, output))
