-- The policy runtime: sandbox, contracts, self tests, limits, reload,
-- versions held by requests, counters, publishing across workers.
local helpers = require "helpers"
local policy = require "tinyloop.policy"

local ROUTING = [[
return { kind = "routing", version = "%s",
         choose = function(req, cands) return cands[1] end }
]]

local function routing(ver)
    return ROUTING:format(ver)
end


local function compile(src, kind)
    return policy.compile(src, "t.lua", { kind = kind, limit = 200000 })
end


local function write(path, text)
    local f = assert(io.open(path, "wb"))
    f:write(text)
    f:close()
end


describe("policy.compile()", function()
    it("loads a policy that meets its kind's contract", function()
        local v = assert(compile(routing("r1")))
        assert.equal("routing", v.kind)
        assert.equal("r1", v.version)
        local ok, c = v:call("choose", {}, { { id = "x" } })
        assert.is_true(ok)
        assert.equal("x", c.id)
    end)

    it("returns immutable versions", function()
        local v = assert(compile(routing("r1")))
        assert.has_error(function() v.version = "r2" end)
        assert.equal("r1", v.version)
    end)

    it("reports a syntax error with file and line", function()
        local v, err = compile("return {\n kind = 'routing',\n version = = 1 }")
        assert.is_nil(v)
        assert.matches("^t%.lua:3: ", err)
    end)

    it("refuses a policy that does not return a table", function()
        local _, err = compile("return 42")
        assert.equal("t.lua: a policy must return a table, got number", err)
    end)

    it("refuses an unknown kind and a kind other than the expected one", function()
        local _, err = compile("return { kind = 'magic', version = '1' }")
        assert.matches("kind must be", err)
        _, err = compile(routing("1"), "eviction")
        assert.equal("t.lua: expected a eviction policy, got routing", err)
    end)

    it("refuses a policy without a version", function()
        local _, err = compile("return { kind = 'routing', choose = function(r, c) return c[1] end }")
        assert.equal("t.lua: version must be a string", err)
    end)

    it("refuses binary chunks", function()
        local _, err = compile(string.dump(function() return {} end))
        assert.equal("t.lua: binary chunks are refused", err)
    end)
end)


describe("the sandbox", function()
    local escapes = {
        io = "return io.open('/etc/passwd')",
        os = "os.execute('true')",
        require = "return require('ffi')",
        ffi = "return ffi.C",
        debug = "debug.sethook()",
        loadstring = "return loadstring('return 1')()",
        load = "return load(function() end)",
        dofile = "return dofile('/etc/passwd')",
        setfenv = "setfenv(1, {})",
        getfenv = "return getfenv(0).io",
        ngx = "return ngx.var",
        rawset = "rawset(string, 'x', 1)",
        collectgarbage = "collectgarbage()",
        coroutine = "return coroutine.create(print)",
        jit = "jit.on()",
        package = "return package.loaded.io",
    }
    for name, src in pairs(escapes) do
        it("refuses " .. name, function()
            local v, err = compile(src)
            assert.is_nil(v)
            assert.matches("attempt to", err)
        end)
    end

    it("refuses changes to the string metatable", function()
        local _, err = compile("getmetatable('').__index.upper = function() return 'pwned' end")
        assert.matches("attempt to index a nil value", err)
        assert.is_nil(select(1, compile("local s = 'x'; s.y = 1; return {}")))
        assert.equal("A", ("a"):upper())
        assert.equal(string, getmetatable("").__index)
    end)

    it("refuses writes through string methods while policy code runs", function()
        local v = assert(compile([[
            return { kind = "routing", version = "1", choose = function(r, c)
                local mt = ("").format    -- methods resolve to the sandbox's read-only table
                assert(type(mt) == "function")
                return c[1]
            end }]]))
        assert.is_true((v:call("choose", {}, { {} })))
        assert.equal(string, getmetatable("").__index)
    end)

    it("gives each version its own copies of string, table and math", function()
        local v = assert(compile([[
            string.upper = nil; table.insert = nil; math.floor = nil
            return { kind = "routing", version = "1", choose = function(r, c) return c[1] end }]]))
        assert.is_truthy(v)
        assert.is_function(string.upper)
        assert.is_function(table.insert)
        assert.is_function(math.floor)
    end)

    it("does not let a policy reseed the process's random generator", function()
        local _, err = compile("math.randomseed(1)")
        assert.matches("attempt to call field 'randomseed'", err)
    end)

    it("stops an infinite loop at load", function()
        local _, err = compile("while true do end")
        assert.equal(policy.LIMIT_MSG, err)
    end)

    it("stops an infinite loop that pcall tries to swallow", function()
        local _, err = compile("while true do pcall(function() while true do end end) end")
        assert.equal(policy.LIMIT_MSG, err)
    end)

    it("catches runaway recursion", function()
        local _, err = compile("local function r(n) return 1 + r(n + 1) end return r(1)")
        assert.matches("stack overflow", err)
    end)

    it("stops an infinite loop in a policy call and keeps serving", function()
        local v = assert(compile([[
            return { kind = "routing", version = "1", choose = function(r, c)
                if r.spin then while true do end end
                return c[1]
            end }]]))
        local ok, err = v:call("choose", { spin = true }, { {} })
        assert.is_false(ok)
        assert.equal(policy.LIMIT_MSG, err)
        assert.is_true((v:call("choose", {}, { {} })))
    end)

    it("caps string.rep", function()
        local _, err = compile("return ('x'):rep(1e9)")
        assert.matches("string.rep result too large", err)
    end)

    it("routes print to the runtime's log", function()
        local lines = {}
        policy.compile("print('hello', 1) return 1", "t.lua", { log = function(s) lines[#lines + 1] = s end })
        assert.same({ "hello\t1" }, lines)
    end)
end)


describe("contracts", function()
    it("requires choose() to return one of the candidates", function()
        local _, err = compile("return { kind = 'routing', version = '1', choose = function() return {} end }")
        assert.matches("contract: choose must return one of the candidates", err)
    end)

    it("requires eviction scores to be finite numbers", function()
        local _, err = compile("return { kind = 'eviction', version = '1', score = function() return 0/0 end }")
        assert.matches("score must return a finite number", err)
    end)

    it("requires eviction weights to be known and finite", function()
        local _, err = compile("return { kind = 'eviction', version = '1', weights = { age = 1 } }")
        assert.matches("weights.age is not one of", err)
        _, err = compile("return { kind = 'eviction', version = '1', weights = { hits = 1/0 } }")
        assert.matches("weights.hits must be a finite number", err)
        _, err = compile("return { kind = 'eviction', version = '1', weights = {}, pool_policy = 'fifo' }")
        assert.matches("pool_policy must be", err)
    end)

    it("requires resolve() to return well-formed tenants", function()
        local _, err = compile("return { kind = 'tenants', version = '1', resolve = function() return { id = 3 } end }")
        assert.matches("resolve returned a bad tenant: tenant.id must be a non%-empty string", err)
        _, err = compile([[return { kind = 'tenants', version = '1',
            tenants = { a = { id = 'a', api_key = 'k', kv_budget = -1 } }, resolve = function() end }]])
        assert.matches("tenant a: kv_budget must be a non%-negative integer", err)
    end)

    it("requires every listed tenant's api key to resolve to it", function()
        local _, err = compile([[return { kind = 'tenants', version = '1',
            tenants = { a = { id = 'a', api_key = 'k' } }, resolve = function() return nil end }]])
        assert.matches("resolve does not map tenant a's api_key to it", err)
    end)

    it("runs the policy's self_test and rejects on failure", function()
        local _, err = compile([[return { kind = 'routing', version = '1',
            choose = function(r, c) return c[1] end, self_test = function() assert(1 == 2, 'math broke') end }]])
        assert.matches("self_test failed: .*math broke", err)
        _, err = compile([[return { kind = 'routing', version = '1',
            choose = function(r, c) return c[1] end, self_test = function() return false, 'nope' end }]])
        assert.matches("self_test failed: nope", err)
    end)

    for _, f in ipairs { "routing", "eviction_lru", "eviction_shortest", "eviction_cost", "tenants" } do
        it("accepts the default lua/policies/" .. f .. ".lua", function()
            local src = helpers.read(helpers.root .. "/lua/policies/" .. f .. ".lua")
            assert.is_truthy(policy.compile(src, f))
        end)
    end
end)


describe("Runtime", function()
    local dir, path, logs, levels, t

    before_each(function()
        dir = helpers.tmpdir()
        path = dir .. "/routing.lua"
        write(path, routing("v1"))
        logs, levels, t = {}, {}, 0
    end)

    after_each(function()
        os.remove(path)
        os.remove(dir)
    end)

    local function rt_new(o)
        o = o or {}
        o.path, o.kind = path, "routing"
        o.log = function(s, level)
            logs[#logs + 1] = s
            levels[#logs] = level
        end
        o.clock = function() return t end
        o.interval_ms = o.interval_ms or 100
        return policy.Runtime(o)
    end

    it("serves the file's version and counts the load", function()
        local rt = rt_new()
        assert.same({ reloads_ok = 1, reloads_rejected = 0, version = "v1", serial = 1, retired_held = 0 },
            rt:counters())
    end)

    it("logs a swap at level notice and a rejection at level warn (the server picks ngx levels from it)", function()
        local rt = rt_new()
        assert.equal("notice", levels[#logs])
        write(path, "return {")
        assert.is_nil(rt:reload())
        assert.matches("rejected", logs[#logs])
        assert.equal("warn", levels[#logs])
    end)

    it("raises when the first load fails", function()
        write(path, "return {")
        assert.has_error(function() rt_new() end)
    end)

    it("checks the file at most every interval_ms at request boundaries", function()
        local rt = rt_new()
        write(path, routing("v2"))
        t = 50
        assert.is_false(rt:maybe_reload())
        assert.equal("v1", rt.current.version)
        t = 150
        assert.is_true(rt:maybe_reload())
        assert.equal("v2", rt.current.version)
        t = 300
        assert.is_false(rt:maybe_reload())         -- unchanged: no reload
        assert.equal(2, rt:counters().reloads_ok)
    end)

    it("keeps the old version when the new file has a syntax error, and logs why", function()
        local rt = rt_new()
        write(path, "return { kind = 'routing',\n version = }")
        local v, err = rt:reload()
        assert.is_nil(v)
        assert.matches(path:gsub("%p", "%%%0") .. ":2: unexpected symbol", err)
        assert.equal("v1", rt.current.version)
        local c = rt:counters()
        assert.equal(1, c.reloads_rejected)
        assert.equal(err, c.last_error)
        assert.matches("rejected: .*:2: .*still serving v1 #1", logs[#logs])
        -- the same broken text is not retried on every check
        t = 1000
        assert.is_false(rt:maybe_reload())
        assert.equal(1, rt:counters().reloads_rejected)
        write(path, routing("v3"))
        t = 2000
        assert.is_true(rt:maybe_reload())
        assert.equal("v3", rt.current.version)
    end)

    it("keeps the old version when the new file loops forever", function()
        local rt = rt_new { limit = 100000 }
        write(path, "while true do end")
        assert.is_nil(rt:reload())
        assert.equal("v1", rt.current.version)
    end)

    it("lets a request in flight finish on the version it started with", function()
        local retired = {}
        local rt = rt_new { on_retire = function(v) retired[#retired + 1] = v.version end }
        local held = rt:acquire()
        write(path, routing("v2"))
        assert.is_truthy(rt:reload())
        assert.equal("v2", rt.current.version)
        assert.equal("v1", held.version)
        assert.is_true((held:call("choose", {}, { {} })))
        assert.same({}, retired)
        assert.equal(1, rt:counters().retired_held)
        rt:release(held)
        assert.same({ "v1" }, retired)
        assert.equal(0, rt:counters().retired_held)
    end)

    it("lets on_swap veto a version", function()
        local rt = rt_new { on_swap = function(v) if v.version == "bad" then return nil, "no room" end return true end }
        write(path, routing("bad"))
        local v, err = rt:reload()
        assert.is_nil(v)
        assert.matches("no room", err)
        assert.equal("v1", rt.current.version)
    end)

    it("takes new source without a file", function()
        local rt = policy.Runtime { source = routing("s1"), kind = "routing" }
        assert.is_truthy(rt:set_source(routing("s2")))
        assert.equal("s2", rt.current.version)
    end)
end)


describe("publish() and sync()", function()
    local function dict()
        local d = { data = {} }
        function d:get(k) return self.data[k] end
        function d:set(k, v) self.data[k] = v return true end
        function d:incr(k, by, init)
            self.data[k] = (self.data[k] or init) + by
            return self.data[k]
        end
        return d
    end

    it("brings every worker to the published version", function()
        local d = dict()
        local w1 = policy.Runtime { source = routing("a"), kind = "routing", name = "routing" }
        local w2 = policy.Runtime { source = routing("a"), kind = "routing", name = "routing" }
        assert.is_truthy(w1:set_source(routing("b")))
        assert.equal(1, w1:publish(d))
        assert.is_false(w1:sync(d))
        assert.is_true(w2:sync(d))
        assert.equal("b", w2.current.version)
        assert.is_false(w2:sync(d))
    end)

    it("keeps the old version on a worker that cannot load the published one", function()
        local d = dict()
        local w2 = policy.Runtime { source = routing("a"), kind = "routing", name = "routing" }
        d:set("policy:routing:src", "return {")
        d:incr("policy:routing:n", 1, 0)
        assert.is_false(w2:sync(d))
        assert.equal("a", w2.current.version)
        assert.equal(1, w2:counters().reloads_rejected)
    end)
end)
