-- Ways out of the policy sandbox's limits, each closed: metamethods on what
-- a policy returns or raises, C pattern functions the count hook cannot
-- see, string builders past the size cap, memory, and loads that take too
-- long. The cases that used to hang run in a child process under
-- `timeout`, so the suite fails instead of hanging on a regression.
local helpers = require "helpers"
local policy = require "tinyloop.policy"
local sandbox = require "tinyloop.policy.sandbox"

local ROUTING = [[
return { kind = "routing", version = "1", choose = function(r, c) return c[1] end,
         self_test = function() %s end }
]]

local TENANTS = [[
return { kind = "tenants", version = "1", resolve = function(req) %s return nil end }
]]


local function compile(src, opts)
    opts = opts or {}
    opts.limit = opts.limit or 200000
    return policy.compile(src, "t.lua", opts)
end


local function self_test(body, opts)
    return compile(ROUTING:format(body), opts)
end


-- isolated(src, opts) -> the output of a child LuaJIT that compiles the
-- policy source src (opts: Lua text of compile's options) and prints the
-- outcome, and whether it finished within 60 s.
local function isolated(src, opts)
    local dir = helpers.tmpdir()
    local script = dir .. "/escape.lua"
    local f = assert(io.open(script, "w"))
    f:write(([[
local policy = require "tinyloop.policy"
local v, err = policy.compile(%q, "t.lua", %s)
io.write(v and "accepted" or ("rejected: " .. err))
]]):format(src, opts or "{}"))
    f:close()
    local cmd = helpers.luajit_cmd():gsub(" luajit$", " timeout 60 luajit")
    local out, ok = helpers.run(cmd .. " '" .. script .. "'")
    os.execute("rm -rf '" .. dir .. "'")
    return out, ok
end


describe("the sandbox's boundary", function()
    it("refuses a result whose table has a metatable, without running its metamethods", function()
        local v = assert(compile(TENANTS:format([[
            if req.evil then
                return setmetatable({ id = "x" }, { __index = function() while true do end end })
            end]])))
        local ok, err = v:call("resolve", { evil = true })
        assert.is_false(ok)
        assert.equal("policy returned a table with a metatable (results must be plain data)", err)
    end)

    it("refuses results that hold functions or cycles", function()
        local v = assert(compile(TENANTS:format([[
            if req.fn then return { id = "x", f = print } end
            if req.cycle then local t = { id = "x" }; t.self = t; return t end]])))
        local ok, err = v:call("resolve", { fn = true })
        assert.is_false(ok)
        assert.matches("policy returned a function", err, 1, true)
        ok, err = v:call("resolve", { cycle = true })
        assert.is_false(ok)
        assert.matches("policy returned a table that contains itself", err, 1, true)
    end)

    it("turns an error object into a string inside the limits (__tostring never runs in host code)", function()
        local v = assert(compile(TENANTS:format([[
            if req.loop then error(setmetatable({}, { __tostring = function() while true do end end })) end
            if req.named then error(setmetatable({}, { __tostring = function() return "named error" end })) end]])))
        local ok, err = v:call("resolve", { loop = true })
        assert.is_false(ok)
        assert.equal(policy.LIMIT_MSG, err)
        ok, err = v:call("resolve", { named = true })
        assert.is_false(ok)
        assert.equal("named error", err)
    end)

    it("gives the policy copies of its arguments: it cannot set a metatable on the caller's tables", function()
        local v = assert(compile(TENANTS:format([[
            setmetatable(req.headers, { __index = function() while true do end end })]])))
        local req = { headers = { ["x-tenant"] = "a" } }
        assert.is_true((v:call("resolve", req)))
        assert.is_nil(getmetatable(req.headers))
        assert.equal("a", req.headers["x-tenant"])
    end)

    it("hands back the caller's own table when the policy returns one of its arguments", function()
        local v = assert(compile(ROUTING:format("")))
        local cands = { { id = "a" }, { id = "b" } }
        local ok, got = v:call("choose", {}, cands)
        assert.is_true(ok)
        assert.is_true(rawequal(cands[1], got))
    end)

    it("refuses policy data with a metatable at load", function()
        local _, err = compile([[
            return { kind = "tenants", version = "1", resolve = function() return nil end,
                     tenants = setmetatable({}, { __index = function() while true do end end }) }]])
        assert.equal("t.lua: tenants holds a table with a metatable (policy data must be plain)", err)
    end)
end)


describe("the sandbox's pattern functions", function()
    it("stop ('a'):rep(1500):find('.-.-b') at the instruction limit", function()
        local _, err = self_test("return ('a'):rep(1500):find('.-.-b') == nil")
        assert.equal("t.lua: self_test failed: " .. policy.LIMIT_MSG, err)
    end)

    it("stop string.find, match, gmatch and gsub the same way", function()
        for _, body in ipairs {
            "return string.find(string.rep('a', 1500), '.-.-b') == nil",
            "return ('a'):rep(1500):match('(.-)(.-)b') == nil",
            "for x in ('a'):rep(1500):gmatch('a-a-b') do end return true",
            "return (('a'):rep(1500):gsub('.-.-b', 'x')) ~= nil",
        } do
            local _, err = self_test(body)
            assert.equal("t.lua: self_test failed: " .. policy.LIMIT_MSG, err)
        end
    end)

    it("do not let ('a'):rep(1500):find('.-.-.-b') hold a load (child process, 60 s timeout)", function()
        local out, finished = isolated(ROUTING:format("return ('a'):rep(1500):find('.-.-.-b') == nil"))
        assert.is_true(finished, out)
        assert.equal("rejected: t.lua: self_test failed: " .. policy.LIMIT_MSG, out)
    end)

    it("still answer ordinary patterns as Lua does", function()
        local v = assert(self_test([[
            assert(("Bearer sk-abc"):match("^Bearer%s+(%S+)$") == "sk-abc")
            assert(select(2, ("a,b,c"):gsub(",", ";")) == 2)
            local n = 0
            for k, val in ("a=1, b=2"):gmatch("(%w+)=(%w+)") do n = n + 1 end
            assert(n == 2)
            assert(string.find(("x"):rep(3000) .. "y", "x-y") == 1)
            return true]], { limit = policy.DEFAULT_LIMIT }))
        assert.is_truthy(v)
    end)
end)


describe("the sandbox's string builders", function()
    it("cap table.concat", function()
        local _, err = self_test([[
            local s = ("x"):rep(1048576)
            return #table.concat({ s, s, s }) > 0]])
        assert.equal("t.lua: self_test failed: t.lua:3: table.concat result too large (2097152 bytes > 1048576)",
            err)
    end)

    it("cap string.format", function()
        local _, err = self_test([[
            local s = ("x"):rep(1048576)
            return #string.format("%s%s", s, s) > 0]])
        assert.matches("string.format result too large", err, 1, true)
    end)

    it("cap string.gsub's result", function()
        local _, err = self_test([[
            local s = ("x"):rep(600000)
            return #s:gsub("x", "yy") > 0]])
        assert.matches("string.gsub result too large", err, 1, true)
    end)

    it("cap string.rep with an empty string too", function()
        local _, err = self_test("return ('').rep('', 1e9) == ''")
        assert.matches("string.rep result too large", err, 1, true)
    end)

    it("refuse table.sort of a huge array without a comparator", function()
        local _, err = self_test("local t = {} for i = 1, 100001 do t[i] = -i end table.sort(t) return true", {
            limit = 10000000 })
        assert.matches("table.sort of 100001 values without a comparator", err, 1, true)
    end)
end)


describe("the sandbox's memory cap and time budget", function()
    local saved_mem, saved_call
    before_each(function()
        saved_mem, saved_call = sandbox.MAX_MEMORY, sandbox.CALL_MS
    end)
    after_each(function()
        sandbox.MAX_MEMORY, sandbox.CALL_MS = saved_mem, saved_call
    end)

    it("stops a policy that fills memory", function()
        sandbox.MAX_MEMORY = 4 * 1048576
        sandbox.CALL_MS = 60000
        local _, err = self_test([[
            local t = {}
            for i = 1, 1e6 do t[i] = ("x"):rep(100) .. i end
            return true]], { limit = 1e9 })
        assert.equal("t.lua: self_test failed: policy exceeded its memory limit (4 MB)", err)
    end)

    it("stops a policy that doubles a string with ..", function()
        sandbox.MAX_MEMORY = 4 * 1048576
        sandbox.CALL_MS = 60000
        local _, err = self_test([[
            local s = ("x"):rep(65536)
            for i = 1, 10 do s = s .. s end
            return true]], { limit = 1e9 })
        assert.equal("t.lua: self_test failed: policy exceeded its memory limit (4 MB)", err)
    end)

    it("stops work done in C functions, which the count hook never sees, by the clock (child process)", function()
        local out, finished = isolated(ROUTING:format([[
            local s = ("x"):rep(1048576)
            while true do s:upper() end]]))
        assert.is_true(finished, out)
        assert.equal("rejected: t.lua: self_test failed: policy exceeded its time limit (250 ms)", out)
    end)

    it("gives a whole load one budget: the chunk, self_test and contract share it (child process)", function()
        local out, finished = isolated([[
            local s = ("x"):rep(1048576)
            for i = 1, 1e9 do s:upper() end
            return {}]], "{ limit = 1e12, load_ms = 50 }")
        assert.is_true(finished, out)
        local ms = tonumber(out:match("^rejected: policy exceeded its time limit %((%d+) ms%)$"))
        assert.is_truthy(ms, out)
        assert.is_true(ms <= 50)
    end)
end)
