-- Shared helpers for the Busted specs: where the repository, ../shared and
-- the test model are, temporary folders, synthetic models, subprocesses.
local _M = {}

local function dirname(p)
    return p:match("^(.*)/[^/]*$") or "."
end


local function abspath(p)
    if p:sub(1, 1) == "/" then
        return p
    end
    return (os.getenv("PWD") or ".") .. "/" .. p
end


local here = debug.getinfo(1, "S").source:sub(2)
_M.root = dirname(dirname(dirname(abspath(here)))):gsub("/%./", "/")
_M.shared = os.getenv("TINYLOOP_SHARED") or (_M.root .. "/../shared")
_M.model_path = _M.shared .. "/models/stories260K.gguf"
_M.ref_path = _M.shared .. "/ref/stories260K_greedy.json"


function _M.exists(path)
    local f = io.open(path, "rb")
    if f then
        f:close()
        return true
    end
    return false
end


function _M.has_model()
    return _M.exists(_M.model_path)
end


-- Inside a describe: marks the block pending with the reason and returns
-- true when stories260K is absent, so the caller can `return`.
function _M.skip_without_model()
    if _M.has_model() then
        return false
    end
    -- busted puts `pending` in the describe block's environment, not in
    -- this module's: take it from the caller's
    local mark = getfenv(2).pending or pending
    mark("SKIP: " .. _M.model_path .. " not found (set TINYLOOP_SHARED)")
    return true
end


function _M.read(path)
    local f = assert(io.open(path, "rb"))
    local s = f:read("*a")
    f:close()
    return s
end


-- A fresh directory. Under tests/spec/run.sh it lies inside the run's own
-- TL_SPEC_TMP, which the runner deletes when busted exits, so specs that
-- write models or packages there leave nothing behind in /tmp.
function _M.tmpdir()
    local root = os.getenv("TL_SPEC_TMP")
    if root and root ~= "" then
        local f = assert(io.popen("mktemp -d '" .. root .. "/d.XXXXXX'"))
        local p = f:read("*l")
        f:close()
        assert(p and p ~= "", "mktemp -d failed under " .. root)
        return p
    end
    local p = os.tmpname()
    os.remove(p)
    assert(os.execute("mkdir -p '" .. p .. "'"))
    return p
end


-- Runs a shell command; returns its output (stdout and stderr) and
-- whether it exited 0.
function _M.run(cmd)
    local f = assert(io.popen("( " .. cmd .. " ) 2>&1; echo \"::rc=$?\""))
    local out = f:read("*a")
    f:close()
    local rc = tonumber(out:match("::rc=(%d+)%s*$"))
    return out:gsub("::rc=%d+%s*$", ""), rc == 0
end


-- A synthetic looped model written by bin/tl-gen-model: 4 layers, loop
-- block [1, 3) run 2 times by default. Cached per process.
local looped
function _M.looped_model()
    if not looped then
        local dir = _M.tmpdir()
        looped = dir .. "/looped.gguf"
        local out, ok = _M.run("'" .. _M.root .. "/bin/tl-gen-model' '" .. looped
            .. "' --layers 4 --loop 1 3 2")
        assert(ok, "tl-gen-model failed: " .. out)
    end
    return looped
end


-- The luajit command line that finds lua/ of this checkout.
function _M.luajit_cmd()
    return "LUA_PATH='" .. _M.root .. "/lua/?.lua;" .. _M.root .. "/lua/?/init.lua;;' luajit"
end


function _M.range(a, b)
    local t = {}
    for i = a, b do
        t[#t + 1] = i
    end
    return t
end


function _M.concat(a, b)
    local t = {}
    for i = 1, #a do
        t[#t + 1] = a[i]
    end
    for i = 1, #b do
        t[#t + 1] = b[i]
    end
    return t
end


function _M.slice(a, i, j)
    local t = {}
    for k = i, j do
        t[#t + 1] = a[k]
    end
    return t
end


return _M
