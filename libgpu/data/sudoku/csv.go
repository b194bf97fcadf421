package sudoku

import (
	"encoding/csv"
	"errors"
	"fmt"
	"io"
	"slices"
	"strconv"
)

// CSVHeader is the first row of a Sudoku-Extreme CSV file
// (huggingface.co/datasets/sapientinc/sudoku-extreme, train.csv and
// test.csv): the puzzle's source collection, the puzzle ('.' for blanks),
// the solution, and a difficulty rating (the number of backtracks a
// reference solver needed, per the dataset card).
var CSVHeader = []string{"source", "question", "answer", "rating"}

// CSVRow is one row of a Sudoku-Extreme CSV file.
type CSVRow struct {
	Source       string
	Input, Label Grid
	Rating       int
}

// ReadCSV reads a Sudoku-Extreme CSV file from r, calling fn for each row
// in order (line is the row's 1-based line number, the header being line
// 1). The header must be CSVHeader; question and answer are 81 characters
// (ParseGrid: '.' or '0' blank), the answer has no blank, rating is an
// integer. Each answer must solve its question (CheckSolution); uniqueness
// is not checked here (Solve does it, slowly on millions of rows). Errors
// give the line; an error from fn stops the reading and is returned as is.
func ReadCSV(r io.Reader, fn func(line int, row CSVRow) error) error {
	cr := csv.NewReader(r)
	cr.FieldsPerRecord = len(CSVHeader)
	cr.ReuseRecord = true
	head, err := cr.Read()
	if err == io.EOF {
		return fmt.Errorf("%w: empty CSV, want the header %v", ErrFormat, CSVHeader)
	}
	if err != nil {
		return fmt.Errorf("%w: CSV: %v", ErrFormat, err)
	}
	if !slices.Equal(head, CSVHeader) {
		return fmt.Errorf("%w: CSV header %v, want %v", ErrFormat, head, CSVHeader)
	}
	for {
		rec, err := cr.Read()
		if err == io.EOF {
			return nil
		}
		line, _ := cr.FieldPos(0)
		if err != nil {
			var pe *csv.ParseError
			if errors.As(err, &pe) {
				line = pe.Line
			}
			return fmt.Errorf("%w: CSV line %d: %v", ErrFormat, line, err)
		}
		row, err := parseRow(rec)
		if err != nil {
			return fmt.Errorf("CSV line %d: %w", line, err)
		}
		if err := fn(line, row); err != nil {
			return err
		}
	}
}

func parseRow(rec []string) (CSVRow, error) {
	row := CSVRow{Source: rec[0]}
	var err error
	if row.Input, err = ParseGrid(rec[1]); err != nil {
		return row, fmt.Errorf("question: %w", err)
	}
	if row.Label, err = ParseGrid(rec[2]); err != nil {
		return row, fmt.Errorf("answer: %w", err)
	}
	if row.Rating, err = strconv.Atoi(rec[3]); err != nil {
		return row, fmt.Errorf("%w: rating %q is not an integer", ErrFormat, rec[3])
	}
	if err := row.Input.Check(); err != nil {
		return row, fmt.Errorf("question: %w", err)
	}
	if err := CheckSolution(row.Input, row.Label); err != nil {
		return row, err
	}
	return row, nil
}

// WriteCSV writes rows in the Sudoku-Extreme layout (CSVHeader first,
// '.' for blanks), which ReadCSV reads back unchanged and the reference's
// build_sudoku_dataset.py accepts.
func WriteCSV(w io.Writer, rows []CSVRow) error {
	cw := csv.NewWriter(w)
	if err := cw.Write(CSVHeader); err != nil {
		return err
	}
	for _, r := range rows {
		if err := cw.Write([]string{r.Source, r.Input.String(), r.Label.String(), strconv.Itoa(r.Rating)}); err != nil {
			return err
		}
	}
	cw.Flush()
	return cw.Error()
}
