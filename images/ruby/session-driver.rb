# codebox's session driver for Ruby: one interpreter whose state lasts across the cells of a
# session. The protocol (docs/sandbox-init.md, "The driver protocol"):
#
#   fd 3  <- cell <execution number> <code length>\n<code>
#   fd 4  -> ready\n                                   (once, at start)
#            syntax <length>\n<message>                (the cell does not parse; nothing ran)
#            compiled\n [result <length>\n<text>] done ok|error [code]|interrupted\n
#
# A cell is evaluated in TOPLEVEL_BINDING, as irb does: its local variables, methods and
# constants stay for the next. The value of the cell, through inspect, is the result (none
# for nil). SIGINT raises Interrupt in a cell and is ignored between cells. `exit n` (and
# `abort`) end the cell, not the interpreter: `done error n`, state kept; `exit!` ends the
# driver. A magic comment (`# frozen_string_literal: true`) on a cell's first line has no
# effect: the line codebox puts before the cell comes first.

module CodeboxDriver
  REQUESTS = IO.for_fd(3, "rb", autoclose: false)
  REPLIES = IO.for_fd(4, "wb", autoclose: false)
  # Code run before the cell's own, on a line 0 of its own: Ruby parses the whole string
  # before it runs any of it, so this runs only once the cell has parsed.
  PREFIX = "::CodeboxDriver.compiled!\n"

  PID = Process.pid # a child a cell forked must not answer for the driver
  @in_cell = false # SIGINT interrupts only while a cell runs
  @parsed = false

  class << self
    attr_reader :in_cell

    def reply(data)
      REPLIES.write(data.b)
    end

    def reply_text(word, text)
      data = text.b
      reply("#{word} #{data.bytesize}\n#{data}")
    end

    def fail(why)
      STDERR.write("codebox ruby driver: #{why}\n")
      exit!(70)
    end

    # The next request's cell: [number, code], or nil when codebox-init closed fd 3.
    def next_request
      header = REQUESTS.gets("\n", 64)
      return nil if header.nil?
      match = /\Acell (\d+) (\d+)\n\z/.match(header)
      fail("a request that is not `cell <n> <length>`: #{header.inspect}") unless match
      length = match[2].to_i
      code = length.zero? ? +"" : REQUESTS.read(length)
      fail("the requests ended inside a cell") if code.nil? || code.bytesize < length
      [match[1].to_i, code]
    end

    # Called by the cell's first line (PREFIX): it parsed.
    def compiled!
      @parsed = true
      reply("compiled\n")
      @in_cell = true
    end

    def set_stdin(path)
      STDIN.reopen(path || File::NULL)
    rescue SystemCallError
      STDIN.reopen(File::NULL)
    end

    # The exception as Ruby prints an uncaught one, without this driver's frames.
    def print_exception(error)
      seen = []
      cause = error
      while cause && !seen.include?(cause)
        seen << cause
        # The SIGINT handler's frame comes first, evaluating the cell's last.
        cause.set_backtrace((cause.backtrace || []).reject { |line| line.start_with?(__FILE__) })
        cause = cause.cause
      end
      STDERR.write(error.full_message(highlight: false, order: :top))
    rescue Exception # rubocop:disable Lint/RescueException
      STDERR.write("#{error.class}: #{error.message}\n")
    end

    # Runs the cell: [status, result text or nil]; nil when it did not parse.
    def execute(number, code)
      @parsed = false
      value = TOPLEVEL_BINDING.eval(PREFIX + code.force_encoding(Encoding::UTF_8),
                                    "(cell #{number})", 0)
      ["ok", value.nil? ? nil : value.inspect]
    rescue SyntaxError => e
      raise unless @parsed # the cell's own; else a SyntaxError raised by code it ran
      print_exception(e)
      ["error", nil]
    rescue SystemExit => e
      [e.status.zero? ? "ok" : "error #{e.status}", nil]
    rescue Interrupt => e
      print_exception(e)
      ["interrupted", nil]
    rescue Exception => e # rubocop:disable Lint/RescueException
      print_exception(e)
      ["error", nil]
    end

    # Answers one request: syntax, or compiled ... done.
    def cell(number, code)
      set_stdin(ENV["CODEBOX_CELL_STDIN"])
      begin
        begin
          status, result = execute(number, code)
          if Process.pid != PID # `fork` without a block in the cell: the child came back here
            $stdout.flush
            $stderr.flush
            exit!(status == "ok" ? 0 : 1)
          end
        rescue SyntaxError => e
          reply_text("syntax", e.message.end_with?("\n") ? e.message : "#{e.message}\n")
          return
        ensure
          @in_cell = false
        end
      rescue Interrupt # a second SIGINT, in a rescue clause above
        status, result = "interrupted", nil
      ensure
        set_stdin(nil)
      end
      [$stdout, $stderr, STDOUT, STDERR].each do |io|
        io.flush
      rescue StandardError
        nil
      end
      reply_text("result", result) if result
      reply("done #{status}\n")
    end

    def main
      trap("INT") { raise Interrupt if CodeboxDriver.in_cell }
      REQUESTS.close_on_exec = true # the cell's subprocesses get neither
      REPLIES.close_on_exec = true
      REPLIES.sync = true
      reply("ready\n")
      while (request = next_request)
        cell(*request)
      end
    end
  end
end

CodeboxDriver.main
