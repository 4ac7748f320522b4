-- One set of generation defaults for the library and the server
-- (args.SAMPLING, issue 16): what generate fills for omitted options and
-- what the server sends for an OpenAI request that leaves them out agree.
local ffi = require "ffi"
local helpers = require "helpers"

local SAMPLED = { "temperature", "top_k", "top_p", "min_p", "repeat_penalty", "repeat_last_n" }

describe("generation defaults", function()
    local tl = require "tinyloop"
    local args = require "tinyloop.args"
    local D = args.SAMPLING
    local saved_ngx

    before_each(function()
        saved_ngx = rawget(_G, "ngx")
        _G.ngx = { time = os.time } -- what server_openai reads at load
        package.loaded["tinyloop.server_openai"] = nil
    end)

    after_each(function()
        _G.ngx = saved_ngx
        package.loaded["tinyloop.server_openai"] = nil
    end)

    local function near(a, b)
        return math.abs(a - b) < 1e-6
    end

    it("fills generate's omitted options from args.SAMPLING", function()
        local p = tl.generate_params()
        assert.are.equal(D.max_tokens, p.max_tokens)
        for _, k in ipairs(SAMPLED) do
            assert.is_true(near(D[k], p.sampling[k]), k)
        end
        assert.are.equal(D.seed, tonumber(p.sampling.seed))
    end)

    it("gives the server's completion and chat requests the library's sampling", function()
        local oa = require "tinyloop.server_openai"
        local lib_p = tl.generate_params()
        for _, o in ipairs { assert(oa.completion_request({ prompt = "x" })),
                             assert(oa.chat_request({ messages = { { role = "user", content = "x" } } })) } do
            local s = args.fill_sampling(ffi.new("tl_sampling_params"), o)
            for _, k in ipairs(SAMPLED) do
                assert.is_true(near(lib_p.sampling[k], s[k]), k)
            end
        end
    end)

    it("turns top_k off at temperature 0 unless given, in both", function()
        local oa = require "tinyloop.server_openai"
        local s = args.fill_sampling(ffi.new("tl_sampling_params"),
            assert(oa.completion_request({ prompt = "x", temperature = 0 })))
        assert.are.equal(0, s.top_k)
        s = args.fill_sampling(ffi.new("tl_sampling_params"), { temperature = 0, top_k = 7 })
        assert.are.equal(7, s.top_k)
    end)

    it("leaves no sampling default written as a number in the server's sources", function()
        local found = {}
        for _, f in ipairs { "server.lua", "server_openai.lua", "server_engine.lua", "chat.lua" } do
            local n = 0
            for line in io.lines(helpers.root .. "/lua/tinyloop/" .. f) do
                n = n + 1
                local code = line:gsub("%-%-.*$", "")
                for _, k in ipairs(SAMPLED) do
                    local rhs = code:match("%f[%w_]" .. k .. "%s*=%s*(.*)$")
                    if rhs and rhs:find("%f[%w_.][1-9][%d.]*%f[^%w_.]") then
                        found[#found + 1] = f .. ":" .. n .. ": " .. line
                    end
                end
            end
        end
        assert.same({}, found)
    end)
end)
